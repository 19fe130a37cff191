// --offload: recompose::apply_offload on the blocks that carry the all-gather hooks (and, with
// --checkpoint full, apply_checkpoint), and what its copies cost against the collectives.
#pragma once

#include "collective_counts.h"
#include "model.h"

#include <recompose/swap.h>

#include <memory>

namespace sharded {

// Offloads every block through one manager (so backward prefetches block i-1 while block i runs)
// that takes every saved activation, however small: the example's blocks are small. Returns the
// manager, whose counters print_offload reads.
std::shared_ptr<recompose::SwapManager> offload_blocks(MlpModel& model);

// What went to host memory and back over the run, and the copies' time against the collectives'.
void print_offload(const MlpModel& model, const recompose::SwapManager& manager,
                   const CollectiveCounts& counts);

}  // namespace sharded
