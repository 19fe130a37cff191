// rebuild_saved: runs a ReplayPlan (replay_plan.cpp; Note [ The replay's contract ]) below
// autograd and autocast, with the generators of random ops where the forward found them.
#include "replay_executor.h"

#include "engine/generator_state.h"
#include "engine/kernels_only.h"
#include "forward_trace.h"
#include "replay_plan.h"
#include "trace_tensors.h"

#include <recompose/checkpoint_error.h>

#include <ATen/core/List.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace recompose::detail {
namespace {

int64_t replay_ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

// The tensor covers its storage's elements from the start, each once (offset 0, dense strides).
bool dense_from_start(const TensorGeometry& g) {
  if (g.offset != 0) return false;
  c10::SmallVector<std::pair<int64_t, int64_t>, 5> dims;  // (stride, size) of dims of size > 1
  for (std::size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 0) return true;
    if (g.sizes[d] != 1) dims.emplace_back(g.strides[d], g.sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// One execution of a plan: the tensors it made or took, by storage, and where it stands.
class Executor {
 public:
  Executor(const ForwardTrace& trace, const ReplayPlan& plan, const std::vector<at::Tensor>& inputs,
           const std::vector<bool>& needed, const ReplayKept& replay_kept,
           std::vector<at::Tensor>& out)
      : t_(trace),
        plan_(plan),
        inputs_(inputs),
        needed_(needed),
        replay_kept_(replay_kept),
        out_(out),
        bases_(trace.storages().size()) {}

  // Runs the plan to its end: whatever could make it stop was decided before (plan_replay,
  // check_sources). Throws CheckpointError if an op returns another layout than in the forward.
  void run(events::ReplayOutcome& outcome) {
    out_.assign(needed_.size(), at::Tensor());
    for (std::size_t n = 0; n < t_.nodes().size(); ++n) {
      emit_saved(n);
      const TraceNode& node = t_.nodes()[n];
      if (!plan_.run[n]) {
        if (!node.kept) ++outcome.ops_skipped;
      } else if (node.kept) {
        take_kept(node);
      } else if (node.draw) {
        write_draw(node, outcome);
      } else if (node.cast) {
        take_cast(node, outcome);
      } else if (node.dropout) {
        rebuild_dropout(node, outcome);
      } else {
        run_op(node, outcome);
      }
      for (uint32_t id : plan_.drop_after[n]) bases_[id] = Base{};
    }
    emit_saved(t_.nodes().size());
  }

 private:
  struct Base {
    at::Tensor tensor;
    int64_t delta = 0;      // its storage offset minus the forward's
    bool views_ok = false;  // on the forward's storage, or a copy laid out alike
  };

  void set_base(uint32_t id, at::Tensor t, bool copy) {
    if (plan_.last_use[id] < 0) return;  // an output nothing reads (a second output of the op...)
    if (copy) t = t.clone();
    const TensorGeometry& forward = t_.storages()[id].base;
    if (!forward.same_shape(t)) {
      if (!dense_from_start(forward) || t.scalar_type() != forward.dtype ||
          t.sizes() != c10::IntArrayRef(forward.sizes))
        throw_not_as_in_forward(id, t);
      // The same values in other strides (a kernel that picks its output's memory format by more
      // than its arguments): laid out again as in the forward, where every use finds them. The
      // forward's output filled its storage from its start, so no use reaches beyond it.
      t = at::empty_strided(forward.sizes, forward.strides, t.options()).copy_(t);
    }
    bases_[id] = Base{std::move(t), 0, true};
    bases_[id].delta = bases_[id].tensor.storage_offset() - t_.storages()[id].base.offset;
  }

  // Note [ A replayed op that returns another layout ]
  // Every op the replay runs gets the forward's arguments (or stand-ins that give the same bits,
  // batch_norm_replay.h; or a cheaper op proven equal, replay_substitute.h), below autograd and
  // autocast as in the forward. An output laid out otherwise then means the op does not give the
  // same result for the same arguments (it reads state beside them, or is nondeterministic in its
  // layout): running the forward again would give other tensors too. Where only the strides
  // differ (a kernel choosing its output's memory format by more than its arguments), the values
  // are the same and set_base lays them out as in the forward. Other sizes or dtypes are what the
  // frame's determinism check reports as "different metadata" in a forward run again; the replay
  // reports it the same way, also under DeterminismCheck::None (PyTorch would hand such tensors to
  // backward unchecked there; a replay cannot go on from them).
  [[noreturn]] void throw_not_as_in_forward(uint32_t id, const at::Tensor& got) const {
    const TraceStorage& s = t_.storages()[id];
    const TraceNode& node = t_.nodes()[s.op];
    auto describe = [](c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype) {
      return std::string(c10::toString(dtype)) + " of sizes " + c10::str(sizes) + " and strides " +
             c10::str(strides);
    };
    throw CheckpointError(
        "recompose: checkpoint: Recomputed values for the following tensors have different "
        "metadata than during the forward pass: the selective replay ran " +
        node.op.schema().name() + " with the forward's arguments and its output " +
        std::to_string(s.output) + " is " +
        describe(got.sizes(), got.strides(), got.scalar_type()) + " where the forward's was " +
        describe(s.base.sizes, s.base.strides, s.base.dtype) +
        ". The op does not return the same result for the same arguments (it is nondeterministic "
        "or reads state beside them); running the region's forward again would differ too. Keep "
        "its output (MUST_SAVE in the region's policy), or make it deterministic.");
  }

  // Inputs and outside tensors were checked before anything ran (check_sources).
  const Base& base_of(uint32_t id) {
    Base& b = bases_[id];
    if (b.tensor.defined()) return b;
    const TraceStorage& s = t_.storages()[id];
    if (s.source == TraceStorage::Source::Input) {
      const at::Tensor& t = inputs_[s.input];
      // A copy of the input (offloaded and reloaded) holds the input, not the rest of its storage.
      b = Base{t, t.storage_offset() - s.base.offset, t.storage().unsafeGetStorageImpl() == s.key};
    } else if (s.source == TraceStorage::Source::Outside) {
      b = Base{s.outside, 0, true};
    } else {
      replay_invariant_broken("an op output was needed before its op ran");
    }
    return b;
  }

  at::Tensor materialize(const TensorUse& use) {
    if (use.storage == TensorUse::kUndefined) return at::Tensor();
    const TraceStorage& s = t_.storages()[use.storage];
    const Base& b = base_of(use.storage);
    if (use.geometry == s.base) return b.tensor;
    // Views of another dtype, and of inputs that came back as copies, were refused up front.
    if (use.geometry.dtype != s.base.dtype) replay_invariant_broken("a view of another dtype");
    if (!b.views_ok) replay_invariant_broken("a view of a region input that came back as a copy");
    return at::as_strided(b.tensor, use.geometry.sizes, use.geometry.strides,
                          use.geometry.offset + b.delta);
  }

  // Hands out the needed saved tensors of positions up to `position`.
  void emit_saved(std::size_t position) {
    for (; next_saved_ < t_.saved_tensors().size() &&
           t_.saved_tensors()[next_saved_].position <= position;
         ++next_saved_) {
      const TraceSaved& s = t_.saved_tensors()[next_saved_];
      if (s.index >= needed_.size() || !needed_[s.index]) continue;
      at::Tensor value = materialize(s.use);
      if (!value.defined()) continue;
      // Read before a later op of the replay writes into it: a copy of the value it has now.
      out_[s.index] = plan_.last_write[s.use.storage] >= static_cast<int64_t>(position)
                          ? value.clone()
                          : alias_of(value);
    }
  }

  void take_kept(const TraceNode& node) {
    torch::jit::Stack stack;
    const bool own = replay_kept_(node.op, *node.kept, &stack);
    const std::size_t n_out = node.op.schema().returns().size();
    for (const auto& [k, id] : node.created) {
      // The replay writes into it: not into a tensor someone else holds (the cache's copy made
      // for the forward's own write, as sdpa's in-place mask add into bmm's output, is not).
      const bool copy = plan_.last_write[id] >= 0 && !own;
      for_each_output(stack, n_out, [&](uint32_t j, const at::Tensor& t) {
        if (j == k) set_base(id, t, copy);
      });
    }
  }

  // The forward's draw, written back where it drew (its first argument): the op's result without
  // drawing. The generators stay where backward found them, as after a redraw.
  void write_draw(const TraceNode& node, events::ReplayOutcome& outcome) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!node.draw->write_into(materialize(t_.uses_of(node)[t_.args_of(node)[0].first])))
      replay_invariant_broken("the tensor a kept draw is written into is laid out otherwise");
    outcome.op_ns += replay_ns_since(t0);
    ++outcome.draws_written;
  }

  // An autocast parameter cast the forward kept: its tensor, not a cast again.
  void take_cast(const TraceNode& node, events::ReplayOutcome& outcome) {
    const uint32_t id = node.created.front().second;
    set_base(id, node.cast->value, plan_.last_write[id] >= 0);
    ++outcome.casts_kept;
  }

  // native_dropout's outputs from its input and the kept draw: the mask, and the output where
  // the replay reads it. The generators stay where backward found them, as after a redraw.
  void rebuild_dropout(const TraceNode& node, events::ReplayOutcome& outcome) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint32_t output = node.created[0].second;
    const uint32_t mask_id = node.created[1].second;
    const TensorGeometry& g = t_.storages()[mask_id].base;
    at::Tensor mask = node.dropout->mask(g.sizes, g.strides);
    if (plan_.last_use[output] >= 0) {
      const at::Tensor input = materialize(t_.uses_of(node)[t_.args_of(node)[0].first]);
      set_base(output, node.dropout->output(input, mask), false);
    }
    set_base(mask_id, std::move(mask), plan_.last_write[mask_id] >= 0);
    outcome.op_ns += replay_ns_since(t0);
    ++outcome.draws_written;
  }

  void push_args(const TraceNode& node, torch::jit::Stack& stack) {
    const c10::ArrayRef<TensorUse> uses = t_.uses_of(node);
    for (const TraceArg& arg : t_.args_of(node)) {
      switch (arg.kind) {
        case TraceArg::Kind::Constant:
          stack.push_back(arg.constant);
          break;
        case TraceArg::Kind::StandIn:
          stack.emplace_back(arg.stand_in->make());
          break;
        case TraceArg::Kind::Tensor:
          stack.emplace_back(materialize(uses[arg.first]));
          break;
        case TraceArg::Kind::TensorList: {
          c10::List<at::Tensor> list;
          list.reserve(arg.count);
          for (uint32_t u = arg.first; u < arg.first + arg.count; ++u)
            list.push_back(materialize(uses[u]));
          stack.emplace_back(std::move(list));
          break;
        }
        case TraceArg::Kind::OptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(arg.count);
          for (uint32_t u = arg.first; u < arg.first + arg.count; ++u) {
            at::Tensor t = materialize(uses[u]);
            list.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
          }
          stack.emplace_back(std::move(list));
          break;
        }
      }
    }
  }

  void run_op(const TraceNode& node, events::ReplayOutcome& outcome) {
    torch::jit::Stack stack;
    push_args(node, stack);
    if (node.rng) node.rng->rewind();
    const auto t0 = std::chrono::steady_clock::now();
    (node.replay_as ? *node.replay_as : node.op).callBoxed(&stack);
    outcome.op_ns += replay_ns_since(t0);
    ++outcome.ops_run;
    if (node.replay_as) ++outcome.ops_substituted;
    if (node.created.empty()) return;
    for_each_output(stack, stack.size(), [&](uint32_t k, const at::Tensor& t) {
      for (const auto& [j, id] : node.created) {
        if (j == k) set_base(id, t, false);
      }
    });
  }

  const ForwardTrace& t_;
  const ReplayPlan& plan_;
  const std::vector<at::Tensor>& inputs_;
  const std::vector<bool>& needed_;
  const ReplayKept& replay_kept_;
  std::vector<at::Tensor>& out_;
  std::vector<Base> bases_;
  std::size_t next_saved_ = 0;
};

// The region inputs and outside tensors the plan reads, as they are now.
MaybeFallback check_sources(const ForwardTrace& trace, const ReplayPlan& plan,
                            const std::vector<at::Tensor>& inputs) {
  // Checked before anything runs: the replay hands kept outputs out (and the cache releases
  // them) as it goes, so it should not give up half-way.
  const std::vector<TraceStorage>& storages = trace.storages();
  for (uint32_t id = 0; id < storages.size(); ++id) {
    if (plan.last_use[id] < 0) continue;
    const TraceStorage& s = storages[id];
    if (s.source == TraceStorage::Source::Outside &&
        version_or_zero(s.outside) != s.outside_version)
      return Fallback(
          "a tensor from outside the region (a parameter?) was modified in place since the "
          "forward");
    if (s.source != TraceStorage::Source::Input) continue;
    if (s.input >= inputs.size() || !inputs[s.input].defined() ||
        !s.base.same_shape(inputs[s.input]))
      return Fallback("a region input came back in another layout");
    if (plan.viewed[id] && inputs[s.input].storage().unsafeGetStorageImpl() != s.key) {
      return Fallback(
          "it needs a view of a region input that came back as another tensor (recomputed by "
          "an enclosing checkpointed region, or offloaded and reloaded)");
    }
  }
  return std::nullopt;
}

}  // namespace

events::ReplayOutcome rebuild_saved(const ForwardTrace& trace,
                                    const std::vector<at::Tensor>& inputs, bool rng_preserved,
                                    const std::vector<bool>& needed, const ReplayKept& replay_kept,
                                    std::vector<at::Tensor>& out) {
  events::ReplayOutcome outcome;
  const ReplayPlan plan = plan_replay(trace, rng_preserved, needed);
  MaybeFallback why = plan.replayable() ? check_sources(trace, plan, inputs) : plan.fallback;
  if (!why) {
    KernelsOnlyGuard kernels_only;
    std::vector<at::Generator> generators;
    const std::vector<TraceNode>& nodes = trace.nodes();
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      const TraceNode& node = nodes[n];
      if (plan.run[n] && node.rng && !node.draw && !node.dropout) node.rng->collect(generators);
    }
    GeneratorStash stash(std::move(generators));
    Executor executor(trace, plan, inputs, needed, replay_kept, out);
    executor.run(outcome);
    outcome.writes_carried = trace.writes_carried();
    outcome.replayed = true;
    return outcome;
  }
  out.clear();
  outcome = events::ReplayOutcome{};
  outcome.fallback_reason = std::move(why->reason);
  return outcome;
}

}  // namespace recompose::detail
