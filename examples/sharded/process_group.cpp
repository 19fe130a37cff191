#include "process_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>

namespace sharded {

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_process_group(const std::string& store_path, int rank, int world,
                                                              std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  store->setTimeout(2 * timeout);  // rendezvous waits for the slowest rank to start
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Loopback by name, not createDefaultDevice(): that binds the hostname's address, which may
  // be unreachable or another machine's in containers.
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 1;  // one collective in flight at a time; more threads only cost memory
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

}  // namespace sharded
