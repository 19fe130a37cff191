// A c10d Gloo process group for one rank of a run on this machine.
#pragma once

#ifndef USE_C10D_GLOO
#error "build with -DUSE_C10D_GLOO=1: ProcessGroupGloo.hpp declares nothing without it"
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <string>

namespace sharded {

// Rendezvous through a FileStore at `store_path` (a file in a folder that the launcher made and
// removes), transport over 127.0.0.1 only. Every collective times out after `timeout`, so a rank
// whose peer died fails instead of waiting forever.
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_process_group(const std::string& store_path, int rank, int world,
                                                              std::chrono::milliseconds timeout);

// Waits for one collective; throws (with c10d's message) on error or timeout.
void wait(const c10::intrusive_ptr<c10d::Work>& work);

}  // namespace sharded
