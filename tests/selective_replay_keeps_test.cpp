// What a selective region keeps for its replay beyond the policy's outputs: native_dropout's draw
// (Note [ Dropout's draw kept on every device ], lib/selective/dropout_draw.h) and autocast's
// casts of parameters (Note [ Parameter casts kept for the replay ], parameter_casts.h). The
// replay neither draws nor casts them again; gradients, outputs and the generators are those of
// plain autograd, bitwise, in float and under CPU bf16 autocast; the bytes held grow by exactly
// what is kept.
#include "selective/parameter_casts.h"
#include "support/op_call_counter.h"

#include <recompose/checkpoint.h>
#include <recompose/policy_report.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/step_ledger.h>

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <set>
#include <vector>

namespace replay_keeps {  // its own names: this file shares a unity group

using recompose::CheckpointOptions;
using recompose::CheckpointPolicy;
using recompose::SelectivePolicy;
using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// Leaves: x [2, 5, 8], LayerNorm weight and bias, w1 [32, 8], b1 [32], w2 [8, 32], w3 [8, 8].
std::vector<torch::Tensor> leaves() {
  torch::manual_seed(0);
  return {torch::randn({2, 5, 8}),     torch::randn({8}),  torch::randn({8}),
          torch::randn({32, 8}) * 0.3, torch::randn({32}), torch::randn({8, 32}) * 0.3,
          torch::randn({8, 8}) * 0.3};
}

// A residual block calling aten::native_dropout, as dropout does on CUDA: the first dropout's
// output is read by a LayerNorm (saved: the replay makes it), the second's only by an add (the
// replay needs its mask alone). Under `bf16`, the block runs under CPU autocast to bfloat16.
torch::Tensor block(const std::vector<torch::Tensor>& p, bool bf16) {
  if (bf16) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  }
  const torch::Tensor& x = p[0];
  auto h = torch::layer_norm(x, {8}, p[1], p[2]);
  auto v = torch::linear(torch::gelu(torch::linear(h, p[3], p[4])), p[5]);
  auto r = x + std::get<0>(at::native_dropout(v, 0.2, true));
  auto m = torch::layer_norm(r, {8}, p[1], p[2]);
  auto y = r + std::get<0>(at::native_dropout(torch::linear(m, p[6]), 0.3, true));
  if (bf16) {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  return y.to(torch::kFloat);
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& p) {
  std::vector<torch::Tensor> out;
  for (const auto& t : p) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

bool same_grads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].grad(), b[i].grad())) return false;
  }
  return true;
}

// Counts the calls of aten::_to_copy whose input is (a view of) one of `params`' storages: a
// parameter cast, in the forward or in a replay (which casts an alias of the parameter).
class ParameterCasts {
 public:
  explicit ParameterCasts(const std::vector<torch::Tensor>& params) {
    storages().clear();
    for (const auto& t : params) storages().insert(t.storage().unsafeGetStorageImpl());
    count().store(0);
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              if (std::strcmp(fn.name(), "aten::_to_copy") != 0 || fn.inputs().empty())
                return nullptr;
              const c10::IValue& self = fn.inputs()[0];
              if (self.isTensor() && self.toTensor().has_storage() &&
                  storages().contains(self.toTensor().storage().unsafeGetStorageImpl()))
                count().fetch_add(1);
              return nullptr;
            })
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }
  ~ParameterCasts() { at::removeCallback(handle_); }
  ParameterCasts(const ParameterCasts&) = delete;
  ParameterCasts& operator=(const ParameterCasts&) = delete;
  int64_t calls() const { return count().load(); }

 private:
  static std::set<const c10::StorageImpl*>& storages() {
    static std::set<const c10::StorageImpl*> s;
    return s;
  }
  static std::atomic<int64_t>& count() {
    static std::atomic<int64_t> c{0};
    return c;
  }
  at::CallbackHandle handle_;
};

struct Step {
  torch::Tensor y;
  std::vector<torch::Tensor> params;
  recompose::SelectiveReplayStats stats;
  torch::Tensor rng_after;      // drawn after the step: the generators as the step left them
  int64_t held = 0;             // bytes the checkpointed forward left held for backward
  int64_t kept_after_fwd = 0;   // selective_checkpoint_bytes_kept() after the forward, less before
  int64_t kept_after_bwd = 0;   // and after the backward
  int64_t parameter_casts = 0;  // in the backward (the replay's)
};

// One step of the block on copies of `p`, checkpointed with `policy` (or plain without one).
Step step(const std::vector<torch::Tensor>& p, bool bf16, const SelectivePolicy* policy,
          bool replay = true) {
  Step s;
  s.params = copies(p);
  torch::manual_seed(7);
  const int64_t kept_before = recompose::selective_checkpoint_bytes_kept();
  {
    recompose::SavedTensorMeter meter;
    if (policy == nullptr) {
      s.y = block(s.params, bf16);
    } else {
      s.y = recompose::checkpoint(
          CheckpointOptions().policy(*policy),
          [&](const torch::Tensor&) { return block(s.params, bf16); }, s.params[0]);
    }
    s.held = meter.bytes_held();
  }
  s.kept_after_fwd = recompose::selective_checkpoint_bytes_kept() - kept_before;
  recompose::reset_selective_replay_stats();
  recompose::set_selective_replay_enabled(replay);
  {
    std::vector<torch::Tensor> weights(s.params.begin() + 1, s.params.end());
    ParameterCasts casts(weights);
    s.y.square().sum().backward();
    s.parameter_casts = casts.calls();
  }
  recompose::set_selective_replay_enabled(true);
  s.stats = recompose::selective_replay_stats();
  s.kept_after_bwd = recompose::selective_checkpoint_bytes_kept() - kept_before;
  s.rng_after = torch::rand({4});
  return s;
}

void check_bitwise(const Step& a, const Step& plain) {
  CHECK(torch::equal(a.y, plain.y));
  CHECK(same_grads(a.params, plain.params));
  CHECK(torch::equal(a.rng_after, plain.rng_after));
}

int64_t bits_bytes(int64_t numel) { return (numel + 7) / 8; }

}  // namespace replay_keeps

TEST_SUITE("selective replay: what the region keeps for it") {
  using namespace replay_keeps;

  TEST_CASE("native_dropout's draw: the replay makes both outputs without drawing, bitwise") {
    const auto p = leaves();
    const SelectivePolicy keep_all_casts = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    const std::vector<SelectivePolicy> policies = {
        recompose::transformer_policy(), keep_all_casts,
        SelectivePolicy(
            [](const recompose::SelectiveCheckpointContext&, const c10::OperatorHandle&,
               const torch::jit::Stack&) { return CheckpointPolicy::PREFER_RECOMPUTE; }),
        SelectivePolicy({"aten::native_layer_norm"})};
    for (const bool bf16 : {false, true}) {
      CAPTURE(bf16);
      const Step plain = step(p, bf16, nullptr);
      for (size_t k = 0; k < policies.size(); ++k) {
        CAPTURE(k);
        rt::OpCallCounter draws("aten::native_dropout");
        const Step s = step(p, bf16, &policies[k]);
        check_bitwise(s, plain);
        CHECK(s.stats.replayed == 1);
        CHECK(s.stats.fallbacks == 0);
        CHECK(s.stats.draws_written == 2);  // both dropouts made from their kept draws
        CHECK(draws.calls() == 2);          // the forward's two; none in the replay
        CHECK(s.kept_after_bwd == 0);       // the draws (and casts) go with the replay
      }
    }
  }

  TEST_CASE("native_dropout's output is made only where the replay reads it") {
    // native_dropout_backward: autograd's, once per dropout, and the replay's for the first
    // dropout only (its output feeds a LayerNorm); the second's mask alone is needed.
    const auto p = leaves();
    const SelectivePolicy policy = recompose::transformer_policy();
    int64_t plain_calls = 0, ckpt_calls = 0;
    {
      rt::OpCallCounter counter("aten::native_dropout_backward");
      step(p, false, nullptr);
      plain_calls = counter.calls();
    }
    {
      rt::OpCallCounter counter("aten::native_dropout_backward");
      step(p, false, &policy);
      ckpt_calls = counter.calls();
    }
    CHECK(plain_calls == 2);
    CHECK(ckpt_calls == plain_calls + 1);
  }

  TEST_CASE("a kept native_dropout draw costs one bit per element on CPU, freed by the replay") {
    // A policy that keeps no output: the bytes kept are the draws' alone.
    const auto p = leaves();
    const SelectivePolicy policy(
        [](const recompose::SelectiveCheckpointContext&, const c10::OperatorHandle&,
           const torch::jit::Stack&) { return CheckpointPolicy::PREFER_RECOMPUTE; });
    const Step s = step(p, false, &policy);
    CHECK(s.kept_after_fwd ==
          2 * bits_bytes(2 * 5 * 8));  // two draws of 80 elements: 10 bytes each
    CHECK(s.kept_after_bwd == 0);
    CHECK(s.stats.draws_written == 2);
  }

  TEST_CASE("the forward run again (replay off) draws again, bitwise, and frees the draws") {
    const auto p = leaves();
    const SelectivePolicy policy = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    for (const bool bf16 : {false, true}) {
      CAPTURE(bf16);
      const Step plain = step(p, bf16, nullptr);
      const Step s = step(p, bf16, &policy, /*replay=*/false);
      check_bitwise(s, plain);
      CHECK(s.stats.fallbacks == 1);
      CHECK(s.stats.replayed == 0);
      CHECK(s.kept_after_bwd == 0);
    }
  }

  TEST_CASE("autocast's parameter casts: kept, the replay casts no parameter, bitwise") {
    const auto p = leaves();
    const Step plain = step(p, true, nullptr);
    const SelectivePolicy none_kept = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(0));
    const SelectivePolicy all_kept = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    const Step before = step(p, true, &none_kept);
    const Step after = step(p, true, &all_kept);
    check_bitwise(before, plain);
    check_bitwise(after, plain);
    // The three weights' casts (w1, w2, w3) are saved by their matrix products; the bias's is not.
    CHECK(before.stats.casts_kept == 0);
    CHECK(before.parameter_casts == 3);  // the replay cast every weight again
    CHECK(after.stats.casts_kept == 3);
    CHECK(after.parameter_casts == 0);
    // The bytes held grow by the casts' bytes, and nothing else: bfloat16 copies of the weights.
    const int64_t casts = 2 * (p[3].numel() + p[5].numel() + p[6].numel());
    CHECK(after.held - before.held == casts);
    CHECK(after.kept_after_fwd - before.kept_after_fwd == casts);
    CHECK(after.kept_after_bwd == 0);
  }

  TEST_CASE("without autocast no cast is kept; held bytes equal whatever the budget") {
    const auto p = leaves();
    const SelectivePolicy none_kept = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(0));
    const SelectivePolicy all_kept = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    const Step a = step(p, false, &none_kept);
    const Step b = step(p, false, &all_kept);
    CHECK(a.held == b.held);
    CHECK(b.stats.casts_kept == 0);
    CHECK(a.kept_after_fwd == b.kept_after_fwd);
  }

  TEST_CASE("the cast budget: smallest casts first, within the room left by the draws") {
    using recompose::detail::cast_room;
    using recompose::detail::casts_within;
    CHECK(casts_within({8, 2, 6}, 8) == std::vector<bool>{false, true, true});
    CHECK(casts_within({8, 2, 6}, 1) == std::vector<bool>{false, false, false});
    CHECK(casts_within({4, 4, 4}, 9) == std::vector<bool>{true, true, false});
    CHECK(casts_within({}, 100).empty());
    CHECK(cast_room(0.05, 1000, 10) == 40);
    CHECK(cast_room(0.05, 1000, 60) == 0);
    CHECK(cast_room(0, 1000, 0) == 0);
    CHECK_THROWS_AS(SelectivePolicy({"aten::mm"}).keep_parameter_casts(-1), std::invalid_argument);
    CHECK(SelectivePolicy({"aten::mm"}).parameter_cast_budget() == 0);
    CHECK(recompose::transformer_policy().parameter_cast_budget() == 0.065);
  }

  TEST_CASE("inspect_policy shows the casts and draws kept for the replay, with their bytes") {
    const auto params = copies(leaves());
    const SelectivePolicy policy = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    const recompose::PolicyReport report = recompose::inspect_policy(
        policy, [&] { block(params, true); }, {}, "block");
    CHECK(report.casts_kept_for_replay == 3);
    CHECK(report.bytes_of_casts_kept ==
          2 * (params[3].numel() + params[5].numel() + params[6].numel()));
    CHECK(report.draws_kept == 2);
    CHECK(report.bytes_of_draws_kept == 2 * bits_bytes(80));
    int64_t rows = 0;
    for (const auto& op : report.ops) rows += op.bytes_kept_for_replay > 0 ? 1 : 0;
    CHECK(rows == 5);
    const std::string text = report.to_string();
    CHECK(text.find("kept for the replay, whatever the policy: 3 autocast parameter casts") !=
          std::string::npos);
    CHECK(text.find("kept for the replay: autocast parameter cast") != std::string::npos);
    CHECK(text.find("recomputed from its kept draw") != std::string::npos);  // native_dropout's
  }

  TEST_CASE("the step ledger lists the casts and draws kept for the replay, with their bytes") {
    const auto params = copies(leaves());
    const SelectivePolicy policy = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    recompose::StepLedger ledger;
    torch::Tensor y = recompose::checkpoint(
        CheckpointOptions().policy(policy),
        [&](const torch::Tensor&) { return block(params, true); }, params[0]);
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 1);
    int64_t cast_tensors = -1, cast_bytes = -1, draw_tensors = -1, draw_bytes = -1;
    for (const auto& k : rows[0].kept) {
      if (k.reason == "parameter cast for the replay") {
        cast_tensors = k.tensors;
        cast_bytes = k.bytes;
      } else if (k.reason == "dropout draw for the replay") {
        draw_tensors = k.tensors;
        draw_bytes = k.bytes;
      }
    }
    CHECK(cast_tensors == 3);
    CHECK(cast_bytes == 2 * (params[3].numel() + params[5].numel() + params[6].numel()));
    CHECK(draw_tensors == 2);
    CHECK(draw_bytes == 2 * bits_bytes(80));
    CHECK(ledger.str().find("parameter cast for the replay") != std::string::npos);
    y.sum().backward();
  }
}
