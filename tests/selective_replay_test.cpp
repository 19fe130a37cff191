// Selective replay (docs/architecture.md, "Selective replay"): a selective region's backward
// rebuilds the saved tensors it dropped by running only the ops that produce them. Gradients are
// those of plain autograd, bitwise; the replay runs exactly the ops it needs; regions it cannot
// replay fall back to running the forward again, counted.
#include "selective/draw_mask.h"
#include "support/op_call_counter.h"
#include "support/selective_helpers.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using recompose::CheckpointError;
using recompose::CheckpointOptions;
using recompose::CheckpointPolicy;
using recompose::SelectiveCheckpointContext;
using recompose::SelectivePolicy;

namespace {

using rt::always;

bool bitwise_equal(const std::vector<torch::Tensor>& x, const std::vector<torch::Tensor>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].defined() != y[i].defined()) return false;
    if (x[i].defined() && !torch::equal(x[i], y[i])) return false;
  }
  return true;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& leaves) {
  std::vector<torch::Tensor> out;
  for (const auto& t : leaves)
    out.push_back(t.grad().defined() ? t.grad().clone() : torch::Tensor());
  return out;
}

// Fresh leaves: the same values, requiring grad, no gradient yet.
std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& leaves) {
  std::vector<torch::Tensor> out;
  for (const auto& t : leaves) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

// Runs `fn` on copies of `leaves` without checkpointing and as one checkpointed region with
// `options`, from the same generator state; checks outputs, gradients and the generator state
// after the step bitwise; returns the replay counters of the checkpointed step.
using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;
// `between`, if given, runs after the checkpointed forward and before its backward.
recompose::SelectiveReplayStats check_against_plain(const Fn& fn,
                                                    const std::vector<torch::Tensor>& leaves,
                                                    const CheckpointOptions& options,
                                                    const std::function<void()>& between = {}) {
  auto plain = copies(leaves);
  torch::manual_seed(7);
  torch::Tensor y_plain = fn(plain);
  y_plain.square().sum().backward();
  const torch::Tensor rng_plain = torch::rand({4});

  auto ckpt = copies(leaves);
  torch::manual_seed(7);
  recompose::reset_selective_replay_stats();
  torch::Tensor y = recompose::checkpoint(
      options, [&](const torch::Tensor&) { return fn(ckpt); }, ckpt[0]);
  if (between) between();
  y.square().sum().backward();
  const auto stats = recompose::selective_replay_stats();
  const torch::Tensor rng_ckpt = torch::rand({4});

  CHECK(torch::equal(y, y_plain));
  CHECK(bitwise_equal(grads_of(ckpt), grads_of(plain)));
  CHECK(torch::equal(rng_ckpt, rng_plain));  // the replay leaves the generator as backward found it
  return stats;
}

CheckpointOptions with(const SelectivePolicy& policy) { return CheckpointOptions().policy(policy); }

// A GPT-like block as plain ops on leaves: LayerNorm, biased projections, causal attention with
// dropout (math path on CPU), residual dropout, GELU MLP. leaves: x, ln weight, ln bias, w_qkv,
// b_qkv, w_proj, w_fc, w_out.
torch::Tensor gpt_block(const std::vector<torch::Tensor>& p) {
  const torch::Tensor& x = p[0];
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), heads = 2;
  auto h = torch::layer_norm(x, {d}, p[1], p[2]);
  auto qkv = torch::linear(h, p[3], p[4])
                 .view({b, t, 3, heads, d / heads})
                 .permute({2, 0, 3, 1, 4})
                 .unbind(0);
  auto y = torch::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.1, true);
  auto r = x + torch::dropout(torch::linear(y.transpose(1, 2).reshape({b, t, d}), p[5]), 0.2, true);
  auto m = torch::layer_norm(r, {d}, p[1], p[2]);
  return r + torch::dropout(torch::linear(torch::gelu(torch::linear(m, p[6])), p[7]), 0.2, true);
}

std::vector<torch::Tensor> gpt_leaves() {
  torch::manual_seed(0);
  const int64_t d = 8;
  return {torch::randn({2, 5, d}),
          torch::randn({d}),
          torch::randn({d}),
          torch::randn({3 * d, d}) * 0.3,
          torch::randn({3 * d}),
          torch::randn({d, d}) * 0.3,
          torch::randn({4 * d, d}) * 0.3,
          torch::randn({d, 4 * d}) * 0.3};
}

using rt::OpCallCounter;

}  // namespace

TEST_SUITE("selective replay") {
  TEST_CASE(
      "a GPT-like block with dropout: bitwise the gradients of plain autograd, for every policy, "
      "replayed") {
    const auto leaves = gpt_leaves();
    struct Case {
      const char* name;
      SelectivePolicy policy;
    };
    const std::vector<Case> cases = {
        {"transformer_policy", recompose::transformer_policy()},
        {"transformer_policy, every second mm",
         recompose::transformer_policy(
             recompose::TransformerPolicyOptions().recompute_every_second_mm(true))},
        {"MUST_SAVE everything", always(CheckpointPolicy::MUST_SAVE)},
        {"PREFER_SAVE everything", always(CheckpointPolicy::PREFER_SAVE)},
        {"PREFER_RECOMPUTE everything", always(CheckpointPolicy::PREFER_RECOMPUTE)},
        {"MUST_RECOMPUTE everything", always(CheckpointPolicy::MUST_RECOMPUTE)},
        {"save list", SelectivePolicy({"aten::addmm", "aten::native_layer_norm"})},
    };
    for (const auto& c : cases) {
      CAPTURE(c.name);
      const auto stats = check_against_plain(gpt_block, leaves, with(c.policy));
      CHECK(stats.replayed == 1);
      CHECK(stats.fallbacks == 0);
      CHECK(stats.last_fallback_reason == "");
    }
  }

  TEST_CASE("the replay runs only the ops whose outputs backward needs") {
    // gelu saves its input (u): backward needs `add` alone. Nothing saves the outputs of gelu,
    // neg, the second add and the last neg (neg and add save nothing): they must not run.
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor u = p[0] + p[1];
      torch::Tensor g = torch::gelu(u);
      return ((-g) + p[1]).neg();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    const auto stats =
        check_against_plain(fn, leaves, with(always(CheckpointPolicy::PREFER_RECOMPUTE)));
    CHECK(stats.replayed == 1);
    CHECK(stats.ops_run == 1);
    CHECK(stats.ops_skipped == 4);
  }

  TEST_CASE("the replay runs every op a dropped saved tensor depends on, however deep") {
    // sin saves its input e = exp(...): exp must run, and the add before it; cos saves s = sin(e):
    // sin must run too. mm is kept (answered from its cache entry, never run); neg is not needed.
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor e = (torch::mm(p[0], p[1]) + p[1]).exp();
      torch::Tensor s = e.sin();
      return s.cos().neg();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}) * 0.3,
                                               torch::randn({4, 4}) * 0.3};
    const auto stats = check_against_plain(fn, leaves, with(SelectivePolicy({"aten::mm"})));
    CHECK(stats.replayed == 1);
    CHECK(stats.fallbacks == 0);
    CHECK(stats.ops_run == 3);      // add, exp, sin
    CHECK(stats.ops_skipped == 2);  // cos, neg
  }

  TEST_CASE("views of op outputs and of the inputs are re-created, not recomputed") {
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor x = p[0];
      torch::Tensor h = torch::sigmoid(x.t());  // a view of the input
      torch::Tensor parts =
          h.reshape({2, 2, 3}).select(1, 1).unsqueeze(0);  // sigmoid's output, viewed
      torch::Tensor s = torch::sin(parts.expand({2, 2, 3}));
      return torch::mm(s.reshape({4, 3}).narrow(0, 1, 3), x.narrow(1, 1, 3).t().contiguous())
          .tanh();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({3, 4})};
    for (const auto& policy :
         {always(CheckpointPolicy::PREFER_RECOMPUTE), SelectivePolicy({"aten::mm"})}) {
      const auto stats = check_against_plain(fn, leaves, with(policy));
      CHECK(stats.replayed == 1);
      CHECK(stats.fallbacks == 0);
    }
  }

  TEST_CASE("in-place ops are replayed in order, on the versions the forward saved") {
    // relu_ saves its result; dropout on CPU is empty_like, bernoulli_, div_, mul; the 3-d
    // Linear on a non-contiguous input is mm, _unsafe_view, add_ (into the storage of mm's output,
    // kept by transformer_policy: the replay writes into a copy, never into the cache).
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor a = (p[0] * 2).relu_();
      torch::Tensor b = torch::dropout(a.sin(), 0.5, true);
      torch::Tensor c = torch::linear(b.transpose(0, 1), p[1], p[2]);
      torch::Tensor d = torch::gelu(c);
      d.mul_(3);
      return d.exp();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({3, 2, 4}), torch::randn({5, 4}) * 0.5,
                                               torch::randn({5})};
    for (const auto& policy :
         {recompose::transformer_policy(), always(CheckpointPolicy::PREFER_RECOMPUTE),
          always(CheckpointPolicy::MUST_SAVE)}) {
      const auto stats = check_against_plain(fn, leaves, with(policy));
      CHECK(stats.replayed == 1);
      CHECK(stats.fallbacks == 0);
    }
  }

  TEST_CASE(
      "random ops draw what they drew in the forward, and the generator ends where backward found "
      "it") {
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor noise = torch::rand_like(p[0]);  // not saved: needed only through mul
      torch::Tensor d = torch::dropout(p[0].exp(), 0.3, true);
      torch::Tensor later = torch::randn({3, 3});  // drawn after: not needed, must not run
      return (d * noise).sin() + later.sum();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({3, 3})};
    const auto stats =
        check_against_plain(fn, leaves, with(always(CheckpointPolicy::PREFER_RECOMPUTE)));
    CHECK(stats.replayed == 1);
    CHECK(stats.fallbacks == 0);
  }

  TEST_CASE("autocast: the casts and low-precision ops of the forward are replayed as they ran") {
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      torch::Tensor y = torch::gelu(torch::mm(p[0], p[1])).sin();
      torch::Tensor z = torch::mm(y, p[1]).to(torch::kFloat);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      return z;
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    const auto stats = check_against_plain(fn, leaves, with(recompose::transformer_policy()));
    CHECK(stats.replayed == 1);
    CHECK(stats.fallbacks == 0);
  }

  TEST_CASE("regions the replay cannot serve run their forward again, counted with the reason") {
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    const auto policy = always(CheckpointPolicy::PREFER_RECOMPUTE);

    SUBCASE("a region nested in the region: the outer one falls back, the inner one replays") {
      const Fn fn = [&](const std::vector<torch::Tensor>& p) {
        torch::Tensor h = p[0].sin();
        torch::Tensor inner = recompose::checkpoint(
            with(policy), [&](const torch::Tensor& a) { return a.exp().cos(); }, h);
        return (inner * p[1]).tanh();
      };
      const auto stats = check_against_plain(fn, leaves, with(policy));
      CHECK(stats.fallbacks >= 1);
      CHECK(stats.replayed >= 1);
      CHECK(stats.last_fallback_reason.find("another checkpointed region") != std::string::npos);
    }
    SUBCASE("a random op it needs under preserve_rng_state(false)") {
      const Fn fn = [](const std::vector<torch::Tensor>& p) {
        return torch::dropout(p[0], 0.5, true).sin();
      };
      auto plain = copies(leaves);
      auto ckpt = copies(leaves);
      recompose::reset_selective_replay_stats();
      torch::Tensor y = recompose::checkpoint(
          with(policy).preserve_rng_state(false), [&](const torch::Tensor&) { return fn(ckpt); },
          ckpt[0]);
      y.sum().backward();
      const auto stats = recompose::selective_replay_stats();
      CHECK(stats.replayed == 0);
      CHECK(stats.fallbacks == 1);
      CHECK(stats.last_fallback_reason.find("preserve_rng_state") != std::string::npos);
    }
    SUBCASE("debug mode") {
      const Fn fn = [](const std::vector<torch::Tensor>& p) { return p[0].exp().sin(); };
      const auto stats = check_against_plain(fn, leaves, with(policy).debug(true));
      CHECK(stats.replayed == 0);
      CHECK(stats.fallbacks == 1);
    }
    SUBCASE("an op it needs writes into a tensor from outside the region") {
      torch::Tensor outside = torch::zeros({4, 4});
      const Fn fn = [&](const std::vector<torch::Tensor>& p) {
        torch::Tensor e = p[0].exp();
        {
          torch::NoGradGuard no_grad;
          outside.zero_();
          outside.add_(e);  // a side effect on a tensor of the caller's
        }
        return (e + outside).sin();  // sin saves e + outside, which reads outside after the write
      };
      const auto stats = check_against_plain(fn, leaves, with(policy));
      CHECK(stats.replayed == 0);
      CHECK(stats.fallbacks == 1);
      CHECK(stats.last_fallback_reason.find("outside") != std::string::npos);
    }
    SUBCASE("replay switched off") {
      recompose::set_selective_replay_enabled(false);
      const Fn fn = [](const std::vector<torch::Tensor>& p) { return p[0].exp().sin(); };
      const auto stats = check_against_plain(fn, leaves, with(policy));
      recompose::set_selective_replay_enabled(true);
      CHECK(stats.replayed == 0);
      CHECK(stats.fallbacks == 1);
    }
    SUBCASE("replay switched off in the forward, on in the backward") {
      // What only a replay reads (draws, generator states, cheaper ops) was not recorded: the
      // region runs its forward again, for the same values.
      const auto block = gpt_leaves();
      recompose::set_selective_replay_enabled(false);
      const auto stats =
          check_against_plain(gpt_block, block, with(recompose::transformer_policy()),
                              [] { recompose::set_selective_replay_enabled(true); });
      recompose::set_selective_replay_enabled(true);
      CHECK(stats.replayed == 0);
      CHECK(stats.fallbacks == 1);
      CHECK(stats.draws_written == 0);
      CHECK(stats.last_fallback_reason.find("off in the region's forward") != std::string::npos);
    }
  }

  TEST_CASE(
      "an in-place write into a kept output nothing read since is carried: no copy in the "
      "forward, not written again by the replay or by a recomputation") {
    // mm is kept; mul_ writes into its output before any op reads it (a Linear's bias, sdpa's
    // mask); gelu saves the written value (neg saves nothing). The kept output holds it: the
    // replay runs nothing, the forward copies nothing, a recomputation takes the kept value and
    // does not write again (writing again would double the values: the gradients would differ).
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor y = torch::mm(p[0], p[1]);
      y.mul_(2);
      return torch::gelu(y).neg();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    const auto policy = with(SelectivePolicy({"aten::mm"}));
    {
      auto ckpt = copies(leaves);
      OpCallCounter clones("aten::clone");
      torch::Tensor y = recompose::checkpoint(
          policy, [&](const torch::Tensor&) { return fn(ckpt); }, ckpt[0]);
      CHECK(clones.calls() == 0);  // no copy of the kept output
      const auto stats = check_against_plain(fn, leaves, policy);
      CHECK(stats.replayed == 1);
      CHECK(stats.ops_run == 0);  // gelu's saved input is the kept, written output
      CHECK(stats.writes_carried == 1);
    }
    SUBCASE("a recomputation that runs the forward again") {
      recompose::set_selective_replay_enabled(false);
      auto ckpt = copies(leaves);
      torch::Tensor y = recompose::checkpoint(
          policy, [&](const torch::Tensor&) { return fn(ckpt); }, ckpt[0]);
      y.square().sum().backward();
      recompose::set_selective_replay_enabled(true);
      auto plain = copies(leaves);
      fn(plain).square().sum().backward();
      CHECK(bitwise_equal(grads_of(ckpt), grads_of(plain)));
    }
  }

  TEST_CASE(
      "in-place ops that change a kept output's layout, not its values, are not carried: a "
      "recomputation runs them") {
    // unsqueeze_ and t_ change the sizes and strides of mm's output in place (and count as
    // writes); a forward run again that skipped them would go on with the wrong layout.
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor y = torch::mm(p[0], p[1]);
      y.t_();
      y.unsqueeze_(0);
      return torch::gelu(y).sum(0).neg();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({3, 4}), torch::randn({4, 5})};
    for (bool replay : {true, false}) {
      CAPTURE(replay);
      recompose::set_selective_replay_enabled(replay);
      const auto stats = check_against_plain(fn, leaves, with(SelectivePolicy({"aten::mm"})));
      recompose::set_selective_replay_enabled(true);
      CHECK(stats.writes_carried == 0);
    }
  }

  TEST_CASE(
      "a kept output that carried a write and that the program writes into after the forward is "
      "recomputed, as a copy would have been left alone") {
    // mm's output carries add_ and is the region's output; the caller then writes into it, which
    // autograd allows (nothing saved it). sin saves y * 3, which the replay makes from the kept
    // output: the region falls back and runs mm and add_ again, for the values of the forward.
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    auto run = [&](const std::vector<torch::Tensor>& p, bool checkpointed) {
      torch::Tensor out;
      auto body = [&](const torch::Tensor&) {
        torch::Tensor y = torch::mm(p[0], p[1]);
        y.add_(1);
        out = y;
        return (y * 3).sin();
      };
      torch::Tensor s = checkpointed
                            ? recompose::checkpoint(with(SelectivePolicy({"aten::mm"})), body, p[0])
                            : body(p[0]);
      {
        torch::NoGradGuard no_grad;
        out.mul_(2);  // the caller's write into the region's output
      }
      (s.sum() + out.sum()).backward();
    };
    auto plain = copies(leaves);
    run(plain, false);
    auto ckpt = copies(leaves);
    recompose::reset_selective_replay_stats();
    run(ckpt, true);
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.fallbacks == 1);
    CHECK(stats.last_fallback_reason.find("modified in place since") != std::string::npos);
    CHECK(bitwise_equal(grads_of(ckpt), grads_of(plain)));
  }

  TEST_CASE("a write into a kept output after an op read it keeps a copy of the value before") {
    // mul reads mm's output before mul_ writes into it: the replay needs the value before the
    // write for it, which the kept output must hold (a copy), and replays the write on another
    // copy for gelu.
    const Fn fn = [](const std::vector<torch::Tensor>& p) {
      torch::Tensor y = torch::mm(p[0], p[1]);
      torch::Tensor s = y * 3;  // saves nothing of y; exp saves its result, which needs s
      y.mul_(2);
      return torch::gelu(y) + s.exp();
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({4, 4}), torch::randn({4, 4})};
    for (bool replay : {true, false}) {
      CAPTURE(replay);
      recompose::set_selective_replay_enabled(replay);
      OpCallCounter clones("aten::clone");
      const auto stats = check_against_plain(fn, leaves, with(SelectivePolicy({"aten::mm"})));
      recompose::set_selective_replay_enabled(true);
      CHECK(clones.calls() > 0);
      CHECK(stats.replayed == (replay ? 1 : 0));
    }
  }

  TEST_CASE("_safe_softmax is replayed as softmax when no row was fully masked, bitwise") {
    // sdpa's math path: softmax with the rows whose inputs are all -inf set to zero. sin saves the
    // result. Without a fully masked row the replay runs softmax alone; with one, _safe_softmax
    // itself (softmax would give that row NaN, and the gradients would differ).
    for (bool masked_row : {false, true}) {
      CAPTURE(masked_row);
      const Fn fn = [&](const std::vector<torch::Tensor>& p) {
        torch::Tensor mask = torch::ones({4, 6}, torch::kBool).triu(1);
        if (masked_row) mask[2].fill_(true);
        torch::Tensor scores = (p[0] * 2).masked_fill(mask, -INFINITY);
        return at::_safe_softmax(scores, -1).sin();
      };
      torch::manual_seed(0);
      const std::vector<torch::Tensor> leaves = {torch::randn({4, 6})};
      auto ckpt = copies(leaves);
      torch::Tensor y = recompose::checkpoint(
          with(always(CheckpointPolicy::PREFER_RECOMPUTE)),
          [&](const torch::Tensor&) { return fn(ckpt); }, ckpt[0]);
      recompose::reset_selective_replay_stats();
      OpCallCounter safe("aten::_safe_softmax");
      y.square().sum().backward();
      CHECK(recompose::selective_replay_stats().replayed == 1);
      CHECK(recompose::selective_replay_stats().ops_substituted == (masked_row ? 0 : 1));
      CHECK((safe.calls() > 0) == masked_row);
      auto plain = copies(leaves);
      fn(plain).square().sum().backward();
      CHECK(bitwise_equal(grads_of(ckpt), grads_of(plain)));
      CHECK_FALSE(ckpt[0].grad().isnan().any().item<bool>());
    }
  }

  TEST_CASE("backward twice over a replayed region with kept outputs is 'backward an extra time'") {
    torch::Tensor a = torch::randn({3, 3}, torch::requires_grad());
    torch::Tensor y = recompose::checkpoint(
        with(SelectivePolicy({"aten::mm"})),
        [](const torch::Tensor& x) { return torch::mm(x, x).sin(); }, a);
    recompose::reset_selective_replay_stats();
    y.sum().backward({}, /*retain_graph=*/true);
    CHECK(recompose::selective_replay_stats().replayed == 1);
    CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("Trying to backward an extra time"),
                         CheckpointError);
  }

  TEST_CASE("backward twice over a replayed region that keeps nothing works") {
    torch::Tensor a = torch::randn({3, 3}, torch::requires_grad());
    torch::Tensor y = recompose::checkpoint(
        with(always(CheckpointPolicy::PREFER_RECOMPUTE)),
        [](const torch::Tensor& x) { return torch::mm(x, x).sin(); }, a);
    y.sum().backward({}, /*retain_graph=*/true);
    const torch::Tensor first = a.grad().clone();
    a.mutable_grad() = torch::Tensor();
    recompose::reset_selective_replay_stats();
    y.sum().backward();
    CHECK(recompose::selective_replay_stats().replayed == 1);
    CHECK(torch::equal(a.grad(), first));
  }

  TEST_CASE("a kept output modified in place before backward is still an error") {
    torch::Tensor a = torch::randn({3, 3}, torch::requires_grad());
    torch::Tensor kept_alias;
    torch::Tensor y = recompose::checkpoint(
        with(SelectivePolicy({"aten::mm"})),
        [&](const torch::Tensor& x) {
          torch::Tensor m = torch::mm(x, x);
          kept_alias = m.detach();
          return m.sin();
        },
        a);
    kept_alias.add_(1);
    CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("modified in place"),
                         CheckpointError);
  }

  TEST_CASE("dropout's draws are written back from the forward's kept bits, not drawn again") {
    // The GPT-like block draws three times (attention, residual and MLP dropout); backward replays
    // what they drew without drawing, bitwise as plain autograd, the generator as without
    // checkpointing.
    const auto leaves = gpt_leaves();
    for (const SelectivePolicy& policy :
         {recompose::transformer_policy(), always(CheckpointPolicy::PREFER_RECOMPUTE)}) {
      auto ckpt = copies(leaves);
      torch::manual_seed(7);
      const int64_t kept_before = recompose::selective_checkpoint_bytes_kept();
      OpCallCounter counter("aten::bernoulli_");  // dropout's draw on CPU
      torch::Tensor y = recompose::checkpoint(
          with(policy), [&](const torch::Tensor&) { return gpt_block(ckpt); }, ckpt[0]);
      CHECK(counter.calls() >=
            3);  // the forward drew (each draw may be seen at several dispatch levels)
      CHECK(recompose::selective_checkpoint_bytes_kept() > kept_before);
      recompose::reset_selective_replay_stats();
      const int64_t before_backward = counter.calls();
      y.square().sum().backward();
      CHECK(counter.calls() == before_backward);  // no draw in backward
      CHECK(recompose::selective_replay_stats().replayed == 1);
      CHECK(recompose::selective_replay_stats().draws_written == 3);
      CHECK(recompose::selective_replay_stats().fallbacks == 0);
      CHECK(recompose::selective_checkpoint_bytes_kept() ==
            kept_before);  // the bits go with the replay
    }
    check_against_plain(gpt_block, leaves, with(recompose::transformer_policy()));
  }

  TEST_CASE("a kept draw costs one bit per element, counted in the bytes kept") {
    torch::manual_seed(0);
    torch::Tensor a = torch::randn({7, 9}, torch::requires_grad());  // 63 elements: 8 bytes of bits
    const int64_t kept_before = recompose::selective_checkpoint_bytes_kept();
    torch::Tensor y = recompose::checkpoint(
        with(always(CheckpointPolicy::PREFER_RECOMPUTE)),
        [](const torch::Tensor& x) { return torch::dropout(x, 0.5, true).sin(); }, a);
    CHECK(recompose::selective_checkpoint_bytes_kept() == kept_before + 8);
    y.sum().backward();
    CHECK(recompose::selective_checkpoint_bytes_kept() == kept_before);
  }

  TEST_CASE("kept draws of every floating dtype are bitwise the draw; other layouts draw again") {
    struct Case {
      const char* name;
      Fn fn;
      int64_t backward_draws;
    };
    const std::vector<Case> cases = {
        {"double",
         [](const std::vector<torch::Tensor>& p) {
           return torch::dropout(p[0].to(torch::kDouble), 0.3, true).exp();
         },
         0},
        {"bfloat16",
         [](const std::vector<torch::Tensor>& p) {
           return torch::dropout(p[0].to(torch::kBFloat16), 0.3, true).exp();
         },
         0},
        {"half",
         [](const std::vector<torch::Tensor>& p) {
           return torch::dropout(p[0].to(torch::kHalf), 0.3, true).exp();
         },
         0},
        {"float, nearly all dropped",
         [](const std::vector<torch::Tensor>& p) {
           return torch::dropout(p[0].exp(), 0.97, true).exp();
         },
         0},
        // empty_like of a transposed tensor is not contiguous: not kept, drawn again from the
        // forward's generator state.
        {"transposed",
         [](const std::vector<torch::Tensor>& p) {
           return torch::dropout(p[0].exp().t(), 0.3, true).exp();
         },
         1},
    };
    torch::manual_seed(0);
    const std::vector<torch::Tensor> leaves = {torch::randn({5, 13})};
    for (const auto& c : cases) {
      CAPTURE(c.name);
      auto ckpt = copies(leaves);
      torch::Tensor y = recompose::checkpoint(
          with(always(CheckpointPolicy::PREFER_RECOMPUTE)),
          [&](const torch::Tensor&) { return c.fn(ckpt); }, ckpt[0]);
      OpCallCounter counter("aten::bernoulli_");  // dropout's draw on CPU
      y.to(torch::kFloat).sum().backward();
      CHECK(counter.calls() == c.backward_draws);
      const auto stats =
          check_against_plain(c.fn, leaves, with(always(CheckpointPolicy::PREFER_RECOMPUTE)));
      CHECK(stats.replayed == 1);
      CHECK(stats.fallbacks == 0);
    }
  }

  TEST_CASE("a second backward over a region with dropout draws again, as the forward drew") {
    torch::manual_seed(0);
    torch::Tensor a = torch::randn({4, 6}, torch::requires_grad());
    const auto fn = [](const torch::Tensor& x) { return torch::dropout(x.exp(), 0.4, true).sin(); };
    torch::manual_seed(3);
    torch::Tensor y_plain = fn(a);
    y_plain.sum().backward({}, /*retain_graph=*/true);
    y_plain.sum().backward();
    const torch::Tensor plain = a.grad().clone();
    a.mutable_grad() = torch::Tensor();

    torch::manual_seed(3);
    torch::Tensor y =
        recompose::checkpoint(with(always(CheckpointPolicy::PREFER_RECOMPUTE)), fn, a);
    y.sum().backward({}, /*retain_graph=*/true);  // writes the kept draw back, then frees it
    OpCallCounter counter("aten::bernoulli_");    // dropout's draw on CPU
    recompose::reset_selective_replay_stats();
    y.sum().backward();
    CHECK(counter.calls() == 1);
    CHECK(recompose::selective_replay_stats().replayed == 1);
    CHECK(torch::equal(a.grad(), plain));
  }

  TEST_CASE("DrawMask keeps only exact draws, and writes back bitwise what it kept") {
    using recompose::detail::DrawMask;
    torch::manual_seed(1);
    for (int64_t n : {1, 7, 8, 9, 63, 64, 65, 1000}) {
      CAPTURE(n);
      for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
        const torch::Tensor drawn = torch::empty({n}, dtype).bernoulli_(0.6);
        auto mask = DrawMask::capture(drawn);
        REQUIRE(mask != nullptr);
        torch::Tensor target = torch::full({n}, 7.0, dtype);
        CHECK(mask->write_into(target));
        CHECK(torch::equal(target, drawn));
        CHECK_FALSE(
            mask->write_into(torch::empty({n + 1}, dtype)));  // another size: nothing written
      }
    }
    torch::Tensor half_value = torch::ones({20});
    half_value[13] = 0.5;
    CHECK(DrawMask::capture(half_value) == nullptr);
    torch::Tensor negative_zero = torch::zeros({20});
    negative_zero[3] = -0.0;
    CHECK(DrawMask::capture(negative_zero) == nullptr);  // -0 is not what a draw writes, nor +0
    CHECK(DrawMask::capture(torch::ones({4, 6}).t()) == nullptr);        // not contiguous
    CHECK(DrawMask::capture(torch::ones({5}, torch::kInt)) == nullptr);  // not floating
  }

}  // TEST_SUITE

namespace {

// A CNN block: conv, batch norm (training: it writes its running statistics), ReLU.
struct ConvBnImpl : torch::nn::Module {
  ConvBnImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::relu(bn(conv(x))).mul(2.0);
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBn);

}  // namespace

TEST_CASE("selective replay: a training batch norm replays with stand-in running statistics") {
  // Note [ Batch norm replayed with stand-in running statistics ]: same bits, no second update.
  auto step = [](bool checkpointed, bool train) {
    torch::manual_seed(11);
    ConvBn block;
    block->train(train);
    if (checkpointed) {
      recompose::apply_checkpoint(
          block, CheckpointOptions().policy(SelectivePolicy({"aten::convolution"})));
    }
    auto x = torch::randn({2, 3, 5, 5}, torch::requires_grad());
    block(x).pow(2).sum().backward();
    return std::vector<torch::Tensor>{x.grad(), block->conv->weight.grad(),
                                      block->bn->weight.grad(), block->bn->running_mean,
                                      block->bn->running_var};
  };
  for (const bool train : {true, false}) {
    CAPTURE(train);
    const auto plain = step(false, train);
    recompose::reset_selective_replay_stats();
    const auto got = step(true, train);
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.replayed == 1);
    CHECK(stats.fallbacks == 0);
    CHECK(bitwise_equal(plain, got));
  }
}
