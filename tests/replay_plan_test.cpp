// ReplayPlan (lib/selective/replay_plan.h): the replay compiled from a forward trace before
// anything runs. A trace is recorded here as the forward's interceptor records one (begin with
// the arguments on the stack, the op run, end with its outputs), without autograd.
#include "selective/replay_plan.h"
#include "selective/forward_summary.h"
#include "selective/forward_trace.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

using recompose::detail::ForwardTrace;
using recompose::detail::OpTraits;
using recompose::detail::reason_of;
using recompose::detail::ReplayPlan;
using recompose::detail::summarize;

namespace {

// Runs op(args...) below autograd, recorded in `trace`; returns its first output.
at::Tensor record(ForwardTrace& trace, const char* name, const char* overload,
                  std::vector<c10::IValue> args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack(args.begin(), args.end());
  trace.begin(op, OpTraits::of(op), stack);
  {
    at::AutoDispatchBelowAutograd below;
    op.callBoxed(&stack);
  }
  trace.end(stack, nullptr, nullptr);
  return stack.front().toTensor();
}

// x -> a = mm(x, w) -> b = relu(a) -> c = mul(b, b); autograd would save x, w (mm), b (relu's
// result) and b twice (mul).
struct Chain {
  ForwardTrace trace;
  at::Tensor x = torch::randn({3, 4});
  at::Tensor w = torch::randn({4, 5});
  at::Tensor a, b, c;
  Chain() {
    trace.add_inputs({x});
    a = record(trace, "aten::mm", "", {x, w});
    b = record(trace, "aten::relu", "", {a});
    c = record(trace, "aten::mul", "Tensor", {b, b});
    trace.saved(0, x);  // position 3: after every op; what matters is which tensors
    trace.saved(1, w);
    trace.saved(2, b);
  }
};

}  // namespace

TEST_CASE("replay plan: only the producers of what backward needs run") {
  Chain chain;
  // b needed: relu and the mm it reads run, the mul after them does not.
  ReplayPlan plan = plan_replay(chain.trace, true, {false, false, true});
  REQUIRE(plan.replayable());
  CHECK(plan.run == std::vector<char>{1, 1, 0});
  // Nothing needed from the region's own ops: the input and the parameter come as they are.
  plan = plan_replay(chain.trace, true, {true, true, false});
  REQUIRE(plan.replayable());
  CHECK(plan.run == std::vector<char>{0, 0, 0});
  // Every storage read is dropped after its last reader; none written by a replayed op.
  plan = plan_replay(chain.trace, true, {true, true, true});
  REQUIRE(plan.replayable());
  for (int64_t w : plan.last_write) CHECK(w == -1);
  std::size_t dropped = 0;
  for (const auto& step : plan.drop_after) dropped += step.size();
  std::size_t read = 0;
  for (int64_t u : plan.last_use) read += u >= 0 ? 1 : 0;
  CHECK(dropped == read);
  CHECK(read == 4);  // x, w, a (read by relu), b
}

TEST_CASE("replay plan: a region that cannot be replayed says why, and runs nothing") {
  Chain chain;
  // The forward context saw three saved tensors; a backward asking about two is inconsistent.
  ReplayPlan plan = plan_replay(chain.trace, true, {false, true});
  CHECK_FALSE(plan.replayable());
  CHECK(reason_of(plan.fallback).find("did not see every tensor") != std::string::npos);
  CHECK(plan.run.empty());

  // A write into a region input before the use backward needs: the input's value then is gone.
  ForwardTrace trace;
  at::Tensor x = torch::randn({4});
  trace.add_inputs({x});
  record(trace, "aten::mul_", "Scalar", {x, 2.0});
  const at::Tensor y = record(trace, "aten::exp", "", {x});
  trace.saved(0, y);
  trace.saved(1, x);
  plan = plan_replay(trace, true, {false, true});
  CHECK_FALSE(plan.replayable());
  CHECK(reason_of(plan.fallback)
            .find("region input or an outside tensor after an op of the region wrote") !=
        std::string::npos);
  // The exp's output alone needs only exp, which reads x after the write: the same refusal.
  plan = plan_replay(trace, true, {true, false});
  CHECK_FALSE(plan.replayable());
  // The summary (what inspect_policy and the planner read) gives the plan's reason, every saved
  // tensor needed; a region that replays gives none, and its plan no fallback.
  CHECK(summarize(trace).replay_fallback ==
        reason_of(plan_replay(trace, true, {true, true}).fallback));
  CHECK_FALSE(summarize(trace).replay_fallback.empty());
  CHECK_FALSE(plan_replay(chain.trace, true, {true, true, true}).fallback.has_value());
  CHECK(summarize(chain.trace).replay_fallback.empty());
}

TEST_CASE("replay plan: a random op needs preserve_rng_state") {
  ForwardTrace trace;
  at::Tensor x = torch::rand({8});
  trace.add_inputs({x});
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::bernoulli", "");
  torch::jit::Stack stack{x, c10::IValue()};
  trace.begin(op, OpTraits::of(op), stack);
  // What the forward's interceptor keeps of a random op: its generators before and after.
  auto effect = std::make_unique<recompose::detail::GeneratorEffect>(
      recompose::detail::GeneratorEffect::before(op, stack));
  {
    at::AutoDispatchBelowAutograd below;
    op.callBoxed(&stack);
  }
  effect->after();
  trace.end(stack, nullptr, std::move(effect));
  trace.saved(0, stack.front().toTensor());
  ReplayPlan plan = plan_replay(trace, /*rng_preserved=*/true, {true});
  REQUIRE(plan.replayable());
  CHECK(plan.run == std::vector<char>{1});
  plan = plan_replay(trace, /*rng_preserved=*/false, {true});
  CHECK_FALSE(plan.replayable());
  CHECK(reason_of(plan.fallback) ==
        "it needs the random op aten::bernoulli and preserve_rng_state is off");
}
