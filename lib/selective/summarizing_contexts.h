// Selective contexts that also hand the region's ForwardSummary to a sink when its forward ends:
// how inspect_policy and the planner's profiler learn what a forward did without recording it
// again (selective_contexts.cpp).
#pragma once

#include "forward_summary.h"

#include <recompose/region_contexts.h>
#include <recompose/selective_checkpoint.h>

#include <memory>

namespace recompose::detail {

// create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation), whose forward also
// records what only the summary reads, and calls `sink` with the summary when it ends, on the
// forward's thread: once per forward of the region (a recomputation that runs the forward again
// calls it not; a region whose forward runs inside an enclosing region's recomputation, as
// checkpoint_sequential's segments, calls it again: is_recomputing() tells). If the summary cannot
// be made (out of host memory), the sink gets one marked ForwardSummary::failed.
std::shared_ptr<RegionContexts> create_summarizing_contexts(const SelectivePolicy& policy,
                                                            bool allow_cache_entry_mutation,
                                                            SummarySink sink);

}  // namespace recompose::detail
