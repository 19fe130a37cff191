// ReplayPlan: a selective replay compiled from the forward trace before anything runs
// (plan_replay, replay_plan.cpp); rebuild_saved (replay_executor.h) executes it. See Note [ The
// replay's contract ] in replay_plan.cpp.
#pragma once

#include "replay_fallback.h"

#include <cstdint>
#include <string>
#include <vector>

namespace recompose::detail {

class ForwardTrace;

struct ReplayPlan {
  // Why the region cannot be replayed (its recomputation then runs the forward again); none when
  // it can, and the rest is filled.
  MaybeFallback fallback;
  // Per recorded op: the replay runs it (or, for a kept op, asks its cache entry for it).
  std::vector<char> run;
  // Per storage: the last op run that writes into it (-1: none). A saved tensor read before that
  // write is handed out as a copy.
  std::vector<int64_t> last_write;
  // Per storage: the last step that reads it (step n: the saved tensors of position n, then op
  // n; -1: nothing reads it). Its tensor is dropped after that step.
  std::vector<int64_t> last_use;
  // Per storage: read in another layout than its base (a view, re-created with as_strided).
  std::vector<char> viewed;
  // Per step (recorded ops + 1): the storages read for the last time in that step.
  std::vector<std::vector<uint32_t>> drop_after;

  bool replayable() const { return !fallback; }
};

// The replay that rebuilding saved tensor i of `trace`'s region for each needed[i] would run, or
// why the region cannot be replayed (ReplayPlan::fallback). Runs nothing. `rng_preserved`: the
// region preserves the RNG state (a random op may run again only then). Throws CheckpointError
// only for a broken invariant of the trace (an internal error).
ReplayPlan plan_replay(const ForwardTrace& trace, bool rng_preserved,
                       const std::vector<bool>& needed);

// Throws the CheckpointError of a broken invariant of the trace or the plan (an internal error:
// never a fallback).
[[noreturn]] void replay_invariant_broken(const std::string& what);

}  // namespace recompose::detail
