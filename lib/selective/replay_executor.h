// rebuild_saved: the selective replay, run from a ForwardTrace (forward_trace.h) by the plan
// plan_replay makes (replay_plan.h). See Note [ The replay's contract ] (replay_plan.cpp).
#pragma once

#include "events/replay_outcome.h"
#include "kept_output.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <vector>

namespace recompose::detail {

class ForwardTrace;

// Hands a kept op's outputs onto `out` (CacheEntry::hand_out, with the region's checks); returns
// true when the tensors it hands are the replay's alone (CacheEntry::private_copies): the replay
// then writes into them rather than into copies.
using ReplayKept =
    std::function<bool(const c10::OperatorHandle& op, KeptOutput& kept, torch::jit::Stack* out)>;

// Rebuilds saved tensor i of `trace`'s region for each needed[i] into out[i] (see
// SavedTensorReplay::replay): plans (plan_replay), checks the region inputs and outside tensors the
// plan reads as they are now, then runs the plan below autograd and autocast, with the generators
// of random ops where the forward found them. `replay_kept` is called once per kept op the replay
// needs, in forward order, after every check that can be made up front. Returns the outcome:
// replayed, or not with the fallback's reason (`out` then empty). Throws CheckpointError when an
// op returns another layout than in the forward (Note [ A replayed op that returns another
// layout ], replay_executor.cpp) or for an internal error.
events::ReplayOutcome rebuild_saved(const ForwardTrace& trace,
                                    const std::vector<at::Tensor>& inputs, bool rng_preserved,
                                    const std::vector<bool>& needed, const ReplayKept& replay_kept,
                                    std::vector<at::Tensor>& out);

}  // namespace recompose::detail
