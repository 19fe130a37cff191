#include "device.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <stdexcept>
#include <string>

namespace sharded {

bool built_with_nccl() {
#ifdef SHARDED_WITH_NCCL
  return true;
#else
  return false;
#endif
}

void check_device_support(const Options& o) {
  if (o.device == "cuda" && !torch::cuda::is_available()) {
    throw std::invalid_argument(
        "--device cuda: no CUDA device here (or this build does not link libtorch_cuda: it is "
        "built with CUDA when meson's 'cuda' option finds a CUDA LibTorch, toolkit and GPU)");
  }
  if (o.backend != "nccl") return;
  if (!built_with_nccl()) {
    throw std::invalid_argument(
        "--backend nccl: this build has no NCCL process group (it needs a CUDA build, a "
        "LibTorch with ProcessGroupNCCL.hpp and nccl.h at configure time; see "
        "examples/sharded/meson.build). Use --backend gloo");
  }
  const int gpus = torch::cuda::device_count();
  if (o.world > gpus) {
    throw std::invalid_argument(
        "--backend nccl: one GPU per rank (NCCL refuses two ranks on one device), and " +
        std::to_string(gpus) + " GPU(s) are here for --world " + std::to_string(o.world) +
        "; use --world " + std::to_string(gpus) + " or --backend gloo");
  }
}

torch::Device rank_device(const Options& o) {
  if (o.device == "cpu") return torch::kCPU;
  const int gpus = torch::cuda::device_count();
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(gpus > 0 ? o.rank % gpus : 0)};
}

void set_current_device(const torch::Device& device) {
  if (!device.is_cpu()) c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
}

void synchronize(const torch::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

}  // namespace sharded
