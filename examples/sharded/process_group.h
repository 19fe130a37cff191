// The c10d process group of one rank of a run on this machine: Gloo (CPU or CUDA tensors) or NCCL
// (CUDA tensors, one GPU per rank), and the one way the trainer runs a collective.
#pragma once

#ifndef USE_C10D_GLOO
#error "build with -DUSE_C10D_GLOO=1: ProcessGroupGloo.hpp declares nothing without it"
#endif

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace sharded {

// Rendezvous through a FileStore at `store_path` (a file in a folder that the launcher made and
// removes), for a rank on `device` (NCCL binds to it; Gloo takes any). Gloo: transport over
// 127.0.0.1 only. `backend` is "gloo" or "nccl"; nccl throws std::invalid_argument in a build
// without it (check_device_support says so earlier). Every collective times out after `timeout`,
// so a rank whose peer died fails instead of waiting forever.
c10::intrusive_ptr<c10d::Backend> make_process_group(const std::string& backend,
                                                     const std::string& store_path, int rank,
                                                     int world, const torch::Device& device,
                                                     std::chrono::milliseconds timeout);

// Waits for one collective; throws (with c10d's message) on error or timeout.
void wait(const c10::intrusive_ptr<c10d::Work>& work);

// Launches one collective, waits for it and returns its seconds on the host clock. On a GPU the
// current stream is synchronised before (the time leaves out compute queued ahead of it) and
// after (NCCL's and Gloo's wait() only make the current stream wait for the collective), so the
// time is the collective's own; the trainer overlaps no collective with compute anyway.
double run_collective(const torch::Device& device,
                      const std::function<c10::intrusive_ptr<c10d::Work>()>& launch);

}  // namespace sharded
