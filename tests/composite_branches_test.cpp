// Composite ops that choose their decomposition by asking whether a tensor is "subclass-like"
// (at::isTensorSubclassLike): under a dispatch mode every tensor is, so an interceptor that were a
// dispatch mode would make a selective region run other ops than plain training (another
// summation order in cross_entropy, an out-of-place bias add in a 3-d Linear). recompose's
// interceptor is not a dispatch mode (Note [ Interception without a dispatch mode ]): inside a
// region these ops decompose as outside it, and the results are plain training's, bitwise.
#include "selective/dispatch_interceptor.h"
#include "support/grad_check.h"
#include "support/selective_helpers.h"

#include <recompose/checkpoint.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/TensorSubclassLikeUtils.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace {

using rt::always;
using rt::ReplaySwitch;

using recompose::CheckpointOptions;
using recompose::CheckpointPolicy;
using recompose::SelectivePolicy;

// Weighted cross entropy with label smoothing and ignored targets: with a weight that is
// "subclass-like", LibTorch sums the target weights with masked_fill (zeros where ignored)
// instead of masked_select, which rounds differently.
torch::Tensor weighted_smoothed_loss(const torch::Tensor& x, const torch::Tensor& w,
                                     const torch::Tensor& target, const torch::Tensor& weight) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(torch::mm(x, w), target,
                          F::CrossEntropyFuncOptions().weight(weight).label_smoothing(0.1));
}

struct LossAndGrads {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

LossAndGrads cross_entropy_under(
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& run) {
  torch::manual_seed(0);
  auto x = torch::randn({4096, 32}, torch::requires_grad());
  auto w = torch::randn({32, 50}, torch::requires_grad());
  torch::Tensor loss = run(x, w);
  loss.backward();
  return {loss.detach(), {x.grad(), w.grad()}};
}

struct CrossEntropyData {
  torch::Tensor target, weight;
  CrossEntropyData() {
    torch::manual_seed(1);
    target = torch::randint(0, 50, {4096}, torch::kLong);
    target.index_put_({torch::rand({4096}) < 0.1}, -100);  // ~10% ignored (the default index)
    weight = torch::rand({50}) + 0.5;
  }
};

}  // namespace

TEST_SUITE("composite branches") {
  TEST_CASE("inside an interceptor no tensor is subclass-like and no dispatch mode is enabled") {
    std::vector<bool> seen;
    SelectivePolicy probe([&](const recompose::SelectiveCheckpointContext&,
                              const c10::OperatorHandle&, const torch::jit::Stack& stack) {
      for (const c10::IValue& v : stack)
        if (v.isTensor()) seen.push_back(at::isTensorSubclassLike(v.toTensor()));
      return CheckpointPolicy::PREFER_RECOMPUTE;
    });
    bool mode_enabled_in_region = true;
    auto x = torch::randn({4, 4}, torch::requires_grad());
    auto y = recompose::checkpoint(
        CheckpointOptions().policy(probe),
        [&](const torch::Tensor& t) {
          mode_enabled_in_region = c10::impl::dispatch_mode_enabled();
          return torch::mm(t, t).relu();
        },
        x);
    y.sum().backward();
    CHECK_FALSE(mode_enabled_in_region);
    REQUIRE_FALSE(seen.empty());
    CHECK(std::find(seen.begin(), seen.end(), true) == seen.end());
  }

  TEST_CASE(
      "weighted cross entropy with label smoothing: loss and gradients bitwise plain under every "
      "selective policy") {
    const CrossEntropyData d;
    const LossAndGrads plain =
        cross_entropy_under([&](const torch::Tensor& x, const torch::Tensor& w) {
          return weighted_smoothed_loss(x, w, d.target, d.weight);
        });
    struct Case {
      const char* name;
      SelectivePolicy policy;
    };
    const std::vector<Case> cases = {
        {"keep everything", always(CheckpointPolicy::MUST_SAVE)},
        {"keep nothing", always(CheckpointPolicy::PREFER_RECOMPUTE)},
        {"keep mm", SelectivePolicy({"aten::mm"})},
    };
    for (const bool replay : {true, false}) {
      ReplaySwitch sw(replay);
      for (const Case& c : cases) {
        INFO(std::string(c.name) << (replay ? ", replayed" : ", run again"));
        const LossAndGrads got =
            cross_entropy_under([&](const torch::Tensor& x, const torch::Tensor& w) {
              return recompose::checkpoint(
                  CheckpointOptions().policy(c.policy),
                  [&](const torch::Tensor& a, const torch::Tensor& b) {
                    return weighted_smoothed_loss(a, b, d.target, d.weight);
                  },
                  x, w);
            });
        CHECK(torch::equal(plain.loss, got.loss));
        CHECK(rt::bitwise_equal(plain.grads, got.grads));
      }
    }
  }

  TEST_CASE("under an interceptor a 3-d Linear on a non-contiguous input adds its bias in place") {
    struct OpNames final : recompose::detail::OpInterceptor {
      std::set<std::string> seen;
      void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
        seen.insert(op.schema().name());
        recompose::detail::run_below(op, stack);
      }
    } names;
    torch::manual_seed(0);
    torch::nn::Linear linear(16, 8);
    auto x = torch::randn({6, 4, 16}).transpose(0, 1).requires_grad_();  // non-contiguous 3-d
    auto plain = linear->forward(x);
    torch::Tensor intercepted;
    {
      recompose::detail::InterceptorScope scope(names);
      intercepted = linear->forward(x);
    }
    CHECK(torch::equal(plain, intercepted));
    CHECK(names.seen.count("aten::add_") == 1);  // LibTorch's in-place bias add, as without one
    CHECK(names.seen.count("aten::add") == 0);
  }
}
