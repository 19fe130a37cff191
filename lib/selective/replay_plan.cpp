// plan_replay: which recorded ops a replay runs, and when it may drop what it made. Pure: reads
// the trace and the needed set, runs nothing, throws only for a broken invariant.

#include "replay_plan.h"
#include "forward_trace.h"
#include "run_set_walk.h"

#include <recompose/checkpoint_error.h>

#include <algorithm>
#include <utility>

namespace recompose::detail {

// Note [ The replay's contract ]
// When backward first needs a selective region, the saved tensors the policy dropped are rebuilt
// without the region's code: plan_replay picks the recorded ops that produce the versions those
// saved tensors read (and the ops these need), back to kept outputs, region inputs and tensors
// from outside the region; rebuild_saved (replay_executor.h) runs them in forward order below
// autograd, autocast and any dispatch mode.
//  - Kept outputs are handed by their cache entries (the policy's checks apply); a write of the
//    forward carried into a kept output (ForwardTrace::carry_write) is never run again.
//  - A kept draw (DrawMask) is written back where the forward drew, a native_dropout's kept draw
//    makes its outputs (Note [ Dropout's draw kept on every device ], dropout_draw.h); other random
//    ops run with their generators where the forward found them, and the generators end where
//    backward found them.
//  - An autocast parameter cast the forward kept (Note [ Parameter casts kept for the replay ],
//    parameter_casts.h) is taken as kept, not cast again.
//  - Each tensor is dropped after its last read, so a replay holds no more than a rerun would.
//  - What the plan cannot rebuild exactly makes the region fall back, with the reason counted
//    (SelectiveReplayStats): an op whose arguments it cannot rebuild, a write into a tensor from
//    outside the region or undeclared in the schema (but native_batch_norm's, see Note [ Batch
//    norm replayed with stand-in running statistics ]), a kept op that writes into an argument, a
//    random op under preserve_rng_state(false), views of another dtype, an outside tensor
//    written since the forward, inputs that came back in another layout.
//  - All of it is decided before anything runs (plan_replay, then rebuild_saved's check of the
//    sources): a replay that starts runs to its end, so a fallback always finds every kept output
//    still there. An op that returns another layout than in the forward is the determinism
//    check's error, as in a forward run again (Note [ A replayed op that returns another layout ],
//    replay_executor.cpp); every other inconsistency is an internal error.
// The fallback runs the region's forward again under the recompute context (the rerun).

void replay_invariant_broken(const std::string& what) {
  throw CheckpointError("recompose: internal error in the selective replay: " + what +
                        "; please report it with the region's code");
}

namespace {

// Marks the op that made the version `use` reads, if a recorded op made it.
MaybeFallback mark_producer(const ForwardTrace& t, const TensorUse& use, std::vector<char>& run) {
  if (use.storage == TensorUse::kUndefined) return std::nullopt;
  if (use.storage == TensorUse::kUnsupported)
    return Fallback(
        "a tensor it needs has no strided storage or has its conjugate or negative bit set");
  const TraceStorage& s = t.storages()[use.storage];
  if (s.source == TraceStorage::Source::Op && use.version == s.kept_version) {
    run[s.op] = 1;  // what its op made, or a value the kept output carries (carry_write)
  } else if (use.version < s.kept_version) {
    // carry_write happens only while nothing read the value before the write.
    replay_invariant_broken("a value of a kept output before a write it carries is needed");
  } else if (use.version > 0) {
    if (s.source != TraceStorage::Source::Op)
      return Fallback(
          "it needs a region input or an outside tensor after an op of the region wrote into it");
    run[s.writers[use.version - 1]] = 1;
  }
  return std::nullopt;
}

MaybeFallback why_not_runnable(const ForwardTrace& t, const TraceNode& node, bool rng_preserved) {
  const std::string name = node.op.schema().name();
  if (!node.complete || node.unsupported)
    return Fallback("it needs " + name + ", whose arguments it cannot rebuild");
  if (node.hidden_writes && !node.kept) {
    return Fallback("it needs " + name +
                    ", which writes into arguments its schema does not declare (batch norm's "
                    "running statistics)");
  }
  for (uint32_t w : node.writes) {
    if (t.storages()[w].source != TraceStorage::Source::Op)
      return Fallback("it needs " + name + ", which writes into a tensor from outside the region");
    if (node.kept) return Fallback("it needs " + name + ", a kept op that writes into an argument");
  }
  if (!node.kept && node.rng && !rng_preserved)
    return Fallback("it needs the random op " + name + " and preserve_rng_state is off");
  return std::nullopt;
}

MaybeFallback mark_run_set(const ForwardTrace& t, bool rng_preserved,
                           const std::vector<bool>& needed, std::vector<char>& run) {
  const std::vector<TraceNode>& nodes = t.nodes();
  run.assign(nodes.size(), 0);
  for (const TraceSaved& s : t.saved_tensors()) {
    if (s.index >= needed.size() || !needed[s.index]) continue;
    if (MaybeFallback why = mark_producer(t, s.use, run)) return why;
  }
  return walk_run_set(
      run, [&](std::size_t n) { return why_not_runnable(t, nodes[n], rng_preserved); },
      [&](std::size_t n) { return nodes[n].kept != nullptr || nodes[n].cast != nullptr; },
      [&](std::size_t n, auto&&) -> MaybeFallback {
        for (const TensorUse& u : t.uses_read(nodes[n])) {
          if (MaybeFallback why = mark_producer(t, u, run)) return why;
        }
        return std::nullopt;
      });
}

MaybeFallback note_reads(const ForwardTrace& t, const std::vector<bool>& needed, ReplayPlan& plan) {
  const std::vector<TraceStorage>& storages = t.storages();
  const std::vector<TraceNode>& nodes = t.nodes();
  plan.last_write.assign(storages.size(), -1);
  plan.last_use.assign(storages.size(), -1);
  plan.viewed.assign(storages.size(), 0);
  auto note_use = [&](const TensorUse& u, int64_t step) -> MaybeFallback {
    if (u.storage >= TensorUse::kUnsupported) return std::nullopt;
    const TraceStorage& s = storages[u.storage];
    plan.last_use[u.storage] = std::max(plan.last_use[u.storage], step);
    if (u.geometry == s.base) return std::nullopt;
    if (u.geometry.dtype != s.base.dtype)
      return Fallback("it needs a view of another dtype than its base");
    plan.viewed[u.storage] = 1;
    return std::nullopt;
  };
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (!plan.run[n]) continue;
    for (uint32_t w : nodes[n].writes) plan.last_write[w] = static_cast<int64_t>(n);
    if (nodes[n].kept || nodes[n].cast) continue;  // answered without reading its arguments
    for (const TensorUse& u : t.uses_read(nodes[n])) {
      if (MaybeFallback why = note_use(u, static_cast<int64_t>(n))) return why;
    }
  }
  for (const TraceSaved& s : t.saved_tensors()) {
    if (!needed[s.index]) continue;
    if (MaybeFallback why = note_use(s.use, s.position)) return why;
  }
  plan.drop_after.assign(nodes.size() + 1, {});
  for (uint32_t id = 0; id < storages.size(); ++id) {
    if (plan.last_use[id] >= 0)
      plan.drop_after[static_cast<std::size_t>(plan.last_use[id])].push_back(id);
  }
  return std::nullopt;
}

}  // namespace

ReplayPlan plan_replay(const ForwardTrace& trace, bool rng_preserved,
                       const std::vector<bool>& needed) {
  ReplayPlan plan;
  if (!trace.ops_completed()) {
    plan.fallback = Fallback("an op of the forward threw");
  } else if (trace.saved_tensors().size() != needed.size()) {
    plan.fallback = Fallback("its forward context did not see every tensor the region saved");
  } else {
    plan.fallback = mark_run_set(trace, rng_preserved, needed, plan.run);
    if (!plan.fallback) plan.fallback = note_reads(trace, needed, plan);
  }
  if (plan.replayable()) return plan;
  ReplayPlan refused;  // the reason alone: nothing of a half-made plan
  refused.fallback = std::move(plan.fallback);
  return refused;
}

}  // namespace recompose::detail
