// The NCCL process group, in a file of its own: only a build with NCCL compiles it (meson:
// has_nccl), and only it includes ProcessGroupNCCL.hpp (which needs nccl.h and the CUDA Toolkit's
// headers).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace sharded {

// One rank of an NCCL group over `store`, bound to `device` (the rank's GPU, the current one).
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world, const c10::Device& device,
                                            std::chrono::milliseconds timeout);

}  // namespace sharded
