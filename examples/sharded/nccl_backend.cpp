#include "nccl_backend.h"

#ifndef USE_C10D_NCCL
#error "build with -DUSE_C10D_NCCL=1: ProcessGroupNCCL.hpp declares nothing without it"
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace sharded {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world, const c10::Device& device,
                                            std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
  pg->setBoundDeviceId(device);  // barrier() uses it instead of guessing the rank's GPU
  return pg;
}

}  // namespace sharded
