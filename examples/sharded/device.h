// The device a rank trains on (--device), and whether this build and machine can run it with the
// asked backend (--backend).
#pragma once

#include "options.h"

#include <torch/torch.h>

namespace sharded {

// Whether this build carries ProcessGroupNCCL (meson: has_nccl, examples/sharded/meson.build).
bool built_with_nccl();

// Throws std::invalid_argument saying what is missing: --device cuda without a CUDA device (or in
// a build without libtorch_cuda), --backend nccl in a build without NCCL, or NCCL with more ranks
// than GPUs (NCCL refuses two ranks on one device; Gloo shares one). The launcher calls it before
// starting any rank, so the error is printed once.
void check_device_support(const Options& o);

// Rank r's device: the CPU, or GPU r modulo the GPUs there (Gloo at world 2 on one GPU: both
// ranks on cuda:0).
torch::Device rank_device(const Options& o);

// Makes `device` the current one of its type for this process (the streams NCCL and Gloo use, the
// device NCCL's barrier picks). A no-op on the CPU.
void set_current_device(const torch::Device& device);

// Waits until the work queued on `device`'s current stream is done (a no-op on the CPU). Only the
// current stream: copies that apply_offload runs on its own stream go on.
void synchronize(const torch::Device& device);

}  // namespace sharded
