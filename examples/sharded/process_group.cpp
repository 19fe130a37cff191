#include "process_group.h"

#include "device.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#ifdef SHARDED_WITH_NCCL
#include "nccl_backend.h"
#endif

#include <stdexcept>

namespace sharded {
namespace {

using Clock = std::chrono::steady_clock;

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Loopback by name, not createDefaultDevice(): that binds the hostname's address, which may
  // be unreachable or another machine's in containers.
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 1;  // one collective in flight at a time; more threads only cost memory
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_process_group(const std::string& backend,
                                                     const std::string& store_path, int rank,
                                                     int world, const torch::Device& device,
                                                     std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  store->setTimeout(2 * timeout);  // rendezvous waits for the slowest rank to start
  if (backend == "gloo") return make_gloo(store, rank, world, timeout);  // any device
  (void)device;
#ifdef SHARDED_WITH_NCCL
  if (backend == "nccl") return make_nccl(store, rank, world, device, timeout);
#endif
  throw std::invalid_argument("sharded: no '" + backend + "' process group in this build");
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

double run_collective(const torch::Device& device,
                      const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
  synchronize(device);
  const auto t0 = Clock::now();
  wait(launch());
  synchronize(device);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace sharded
