// ForwardTrace::replay: runs a ReplayPlan (replay_plan.cpp; Note [ The replay's contract ]) below
// autograd and autocast, with the generators of random ops where the forward found them.

#include "engine/generator_state.h"
#include "engine/kernels_only.h"
#include "forward_trace.h"
#include "replay_plan.h"
#include "trace_tensors.h"

#include <ATen/core/List.h>
#include <ATen/ops/as_strided.h>

#include <chrono>
#include <utility>

namespace recompose::detail {
namespace {

int64_t replay_ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

// One execution of a plan: the tensors it made or took, by storage, and where it stands.
class ForwardTrace::Executor {
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
        bases_(trace.storages_.size()) {}

  // Runs the plan; false (and why()) when an op returned another layout than in the forward.
  bool run(ReplayOutcome& outcome) {
    out_.assign(needed_.size(), at::Tensor());
    for (std::size_t n = 0; n < t_.nodes_.size() && why_.empty(); ++n) {
      emit_saved(n);
      const Node& node = t_.nodes_[n];
      if (!plan_.run[n]) {
        if (!node.kept) ++outcome.ops_skipped;
      } else if (node.kept) {
        take_kept(node);
      } else if (node.draw) {
        write_draw(node, outcome);
      } else {
        run_op(node, outcome);
      }
      for (uint32_t id : plan_.drop_after[n]) bases_[id] = Base{};
    }
    if (!why_.empty()) return false;
    emit_saved(t_.nodes_.size());
    return true;
  }
  const std::string& why() const { return why_; }

 private:
  struct Base {
    at::Tensor tensor;
    int64_t delta = 0;      // its storage offset minus the forward's
    bool views_ok = false;  // on the forward's storage, or a copy laid out alike
  };

  void set_base(uint32_t id, at::Tensor t, bool copy) {
    if (plan_.last_use[id] < 0) return;  // an output nothing reads (a second output of the op...)
    if (copy) t = t.clone();
    if (!t_.storages_[id].base.same_shape(t)) {
      why_ = "an op it ran returned a tensor laid out otherwise than in the forward";
      return;
    }
    bases_[id] = Base{std::move(t), 0, true};
    bases_[id].delta = bases_[id].tensor.storage_offset() - t_.storages_[id].base.offset;
  }

  // Inputs and outside tensors were checked before anything ran (ForwardTrace::check_sources).
  const Base& base_of(uint32_t id) {
    Base& b = bases_[id];
    if (b.tensor.defined()) return b;
    const Storage& s = t_.storages_[id];
    if (s.source == Storage::Source::Input) {
      const at::Tensor& t = inputs_[s.input];
      // A copy of the input (offloaded and reloaded) holds the input, not the rest of its storage.
      b = Base{t, t.storage_offset() - s.base.offset, t.storage().unsafeGetStorageImpl() == s.key};
    } else if (s.source == Storage::Source::Outside) {
      b = Base{s.outside, 0, true};
    } else {
      replay_invariant_broken("an op output was needed before its op ran");
    }
    return b;
  }

  at::Tensor materialize(const TensorUse& use) {
    if (use.storage == TensorUse::kUndefined) return at::Tensor();
    const Storage& s = t_.storages_[use.storage];
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
    for (; next_saved_ < t_.saved_.size() && t_.saved_[next_saved_].position <= position;
         ++next_saved_) {
      const Saved& s = t_.saved_[next_saved_];
      if (s.index >= needed_.size() || !needed_[s.index]) continue;
      at::Tensor value = materialize(s.use);
      if (!value.defined()) continue;
      // Read before a later op of the replay writes into it: a copy of the value it has now.
      out_[s.index] = plan_.last_write[s.use.storage] >= static_cast<int64_t>(position)
                          ? value.clone()
                          : alias_of(value);
    }
  }

  void take_kept(const Node& node) {
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
  void write_draw(const Node& node, ReplayOutcome& outcome) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!node.draw->write_into(materialize(node.uses[node.args[0].first])))
      replay_invariant_broken("the tensor a kept draw is written into is laid out otherwise");
    outcome.op_ns += replay_ns_since(t0);
    ++outcome.draws_written;
  }

  void push_args(const Node& node, torch::jit::Stack& stack) {
    for (const Arg& arg : node.args) {
      switch (arg.kind) {
        case Arg::Kind::Constant:
          stack.push_back(arg.constant);
          break;
        case Arg::Kind::Tensor:
          stack.emplace_back(materialize(node.uses[arg.first]));
          break;
        case Arg::Kind::TensorList: {
          c10::List<at::Tensor> list;
          list.reserve(arg.count);
          for (uint32_t u = arg.first; u < arg.first + arg.count; ++u)
            list.push_back(materialize(node.uses[u]));
          stack.emplace_back(std::move(list));
          break;
        }
        case Arg::Kind::OptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(arg.count);
          for (uint32_t u = arg.first; u < arg.first + arg.count; ++u) {
            at::Tensor t = materialize(node.uses[u]);
            list.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
          }
          stack.emplace_back(std::move(list));
          break;
        }
      }
    }
  }

  void run_op(const Node& node, ReplayOutcome& outcome) {
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
  std::string why_;
};

std::string ForwardTrace::check_sources(const ReplayPlan& plan,
                                        const std::vector<at::Tensor>& inputs) const {
  // Checked before anything runs: the replay hands kept outputs out (and the cache releases
  // them) as it goes, so it should not give up half-way.
  for (uint32_t id = 0; id < storages_.size(); ++id) {
    if (plan.last_use[id] < 0) continue;
    const Storage& s = storages_[id];
    if (s.source == Storage::Source::Outside && version_or_zero(s.outside) != s.outside_version)
      return "a tensor from outside the region (a parameter?) was modified in place since the "
             "forward";
    if (s.source != Storage::Source::Input) continue;
    if (s.input >= inputs.size() || !inputs[s.input].defined() ||
        !s.base.same_shape(inputs[s.input]))
      return "a region input came back in another layout";
    if (plan.viewed[id] && inputs[s.input].storage().unsafeGetStorageImpl() != s.key) {
      return "it needs a view of a region input that came back as another tensor (recomputed by "
             "an enclosing checkpointed region, or offloaded and reloaded)";
    }
  }
  return {};
}

ReplayOutcome ForwardTrace::replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
                                   const std::vector<bool>& needed, const ReplayKept& replay_kept,
                                   std::vector<at::Tensor>& out) const {
  ReplayOutcome outcome;
  const ReplayPlan plan = plan_replay(rng_preserved, needed);
  std::string why = plan.replayable() ? check_sources(plan, inputs) : plan.fallback;
  if (why.empty()) {
    KernelsOnlyGuard kernels_only;
    std::vector<at::Generator> generators;
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      if (plan.run[n] && nodes_[n].rng && !nodes_[n].draw) nodes_[n].rng->collect(generators);
    }
    GeneratorStash stash(std::move(generators));
    Executor executor(*this, plan, inputs, needed, replay_kept, out);
    if (executor.run(outcome)) {
      outcome.writes_carried = writes_carried_;
      outcome.replayed = true;
      return outcome;
    }
    why = executor.why();
  }
  out.clear();
  outcome = ReplayOutcome{};
  outcome.fallback_reason = std::move(why);
  return outcome;
}

}  // namespace recompose::detail
