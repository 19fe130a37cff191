// What a profile's op times say once run 2 (the intercepted run) is over: each op's recomputation,
// not what the profiler measured between two calls of its keep-all policy. That span holds the op
// and what ran since the op before: the profiler's recording (scaled away, to sum to the plain
// forward) and the ops no policy sees, among them dropout's draw on CPU, which a replay writes
// back from its kept bits instead of running (taken out of the span). See Note [ Op times scaled
// to the plain forward ] and Note [ A kept draw is no op's recomputation ] (op_times.cpp).
#pragma once

#include "selective/forward_summary.h"

#include <recompose/memory_profile.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

// `m`'s ops hold their measured spans in `seconds` (summed over the module's calls), `draws[k]`
// the host seconds of the draws kept as bits inside op k's span (shorter: none). Leaves each op
// its recomputation (the draws out where the module replays), scaled so that the spans sum to at
// most the plain forward_seconds, and selective_forward_seconds at least the plain forward, above
// it by what the intercepted forward spent outside the spans.
void settle_op_times(ModuleProfile& m, const std::vector<double>& draws);

// Adds to `draws[k]` the draws kept as bits (SummaryOp::draw_seconds) that ran in the span of op
// k of the profile: those since the summary's Decided op before, up to the Decided op the summary
// maps to k (`index_of[e]`: summary entry e's op in the profile, -1 for none; a draw before an
// unmapped op, or after the last Decided one, lands in no span). Grows `draws` as needed; a
// module called several times adds each call's.
void add_draws_in_spans(const ForwardSummary& summary, const std::vector<int64_t>& index_of,
                        std::vector<double>& draws);

}  // namespace recompose::detail
