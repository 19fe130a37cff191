// The memory_viz snapshot's parts (include/recompose/memory_snapshot.h): what the recording's
// sink tells the CPU writer (memory_snapshot_pickle.cpp) beside the counting allocator's trace.
#pragma once

#include "memory/cpu_memory_counter.h"

#include <cstdint>
#include <string>
#include <vector>

namespace recompose::detail {

// An allocation a region saved for backward (its inputs held as autograd holds them, the
// storages the meters were charged): the trace's live allocation at `addr` when `sequence`
// entries had been recorded.
struct HeldMark {
  uint64_t sequence = 0;
  uint64_t addr = 0;
  std::string region;  // "#k <module type>"
};

// The CPU trace as the pickle memory_viz reads (the dict torch::cuda::_memory_snapshot_pickled
// writes, device 0), pickled by LibTorch's pickler as Python's pickle loads it.
std::string cpu_snapshot_pickle(const CpuTrace& trace, const std::vector<HeldMark>& held);

}  // namespace recompose::detail
