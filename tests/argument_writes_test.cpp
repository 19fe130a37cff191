// Ops that write into an argument they save for backward (rrelu_with_noise draws its slopes into
// `noise`, a buffer the region made): backward reads the buffer as the op wrote it, so every way
// of recomputing the region must hand it back written. See Note [ Early stop after the op's own
// writes ].
#include "support/grad_check.h"
#include "support/op_call_counter.h"
#include "support/selective_helpers.h"

#include <recompose/checkpoint.h>
#include <recompose/selective_checkpoint.h>
#ifndef RECOMPOSE_TEST_NO_SWAP
#include <recompose/swap.h>
#endif

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace {

using rt::always;
using rt::ReplaySwitch;

using recompose::CheckpointOptions;
using recompose::CheckpointPolicy;
using recompose::SelectivePolicy;

// rrelu's last saving op is rrelu_with_noise itself (the add saves nothing): early stop would
// stop at its save of `noise`, before its kernel draws into it.
torch::Tensor rrelu_body(const torch::Tensor& x, const torch::Tensor& w) {
  return torch::rrelu(torch::mm(x, w), 0.1, 0.3, /*training=*/true).add(1.0);
}

std::vector<torch::Tensor> grads_under(
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& run) {
  torch::manual_seed(0);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto w = torch::randn({16, 12}, torch::requires_grad());
  torch::manual_seed(7);  // the slopes rrelu draws
  run(x, w).square().sum().backward();
  return {x.grad(), w.grad()};
}

}  // namespace

TEST_SUITE("argument writes") {
  TEST_CASE(
      "full checkpointing with early stop recomputes rrelu's noise as its kernel wrote it, "
      "bitwise") {
    const auto plain = grads_under(rrelu_body);
    // Early stop is the default.
    CHECK(rt::bitwise_equal(plain, grads_under([](const torch::Tensor& x, const torch::Tensor& w) {
                              return recompose::checkpoint(rrelu_body, x, w);
                            })));
    CHECK(rt::bitwise_equal(plain, grads_under([](const torch::Tensor& x, const torch::Tensor& w) {
                              return recompose::checkpoint(CheckpointOptions().early_stop(false),
                                                           rrelu_body, x, w);
                            })));
  }

  TEST_CASE("a region still stops early before its last matrix product's kernel") {
    // mm saves its inputs, which need gradients: no op writes into those, so early stop stays,
    // and the add after mm is not run again.
    auto body = [](const torch::Tensor& x, const torch::Tensor& w) {
      return torch::mm(torch::tanh(x), w).add(1.0);
    };
    auto adds_in_backward = [&](bool early_stop) {
      torch::manual_seed(0);
      auto x = torch::randn({8, 16}, torch::requires_grad());
      auto w = torch::randn({16, 12}, torch::requires_grad());
      auto loss = recompose::checkpoint(CheckpointOptions().early_stop(early_stop), body, x, w)
                      .square()
                      .sum();
      rt::OpCallCounter adds("aten::add");
      loss.backward();
      return adds.calls();
    };
    CHECK(adds_in_backward(true) < adds_in_backward(false));
  }

  TEST_CASE("every selective policy, replayed or run again, gives plain rrelu gradients") {
    const auto plain = grads_under(rrelu_body);
    struct Case {
      const char* name;
      SelectivePolicy policy;
    };
    const std::vector<Case> cases = {
        {"keep everything", always(CheckpointPolicy::MUST_SAVE)},
        {"keep nothing", always(CheckpointPolicy::PREFER_RECOMPUTE)},
        {"keep mm", SelectivePolicy({"aten::mm"})},
        {"keep rrelu_with_noise by name", SelectivePolicy({"aten::rrelu_with_noise"})},
    };
    for (const bool replay : {true, false}) {
      ReplaySwitch sw(replay);
      for (const Case& c : cases) {
        INFO(c.name << (replay ? ", replayed" : ", run again"));
        recompose::reset_selective_replay_stats();
        const auto got = grads_under([&](const torch::Tensor& x, const torch::Tensor& w) {
          return recompose::checkpoint(CheckpointOptions().policy(c.policy), rrelu_body, x, w);
        });
        CHECK(rt::bitwise_equal(plain, got));
        const auto stats = recompose::selective_replay_stats();
        CHECK(stats.replayed == (replay ? 1 : 0));
        CHECK(stats.fallbacks == (replay ? 0 : 1));
      }
    }
  }

#ifndef RECOMPOSE_TEST_NO_SWAP
  TEST_CASE("AsyncSaveOnCpu offloads rrelu's noise once the draw is in it, not before") {
    const auto plain = grads_under(rrelu_body);
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    const auto got = grads_under([&](const torch::Tensor& x, const torch::Tensor& w) {
      recompose::AsyncSaveOnCpu scope(manager);
      return rrelu_body(x, w);
    });
    CHECK(rt::bitwise_equal(plain, got));
    // mm's x and w are leaves that need gradients (kept); rrelu's input and its noise go.
    CHECK(manager->stats().tensors_offloaded == 2);
  }
#endif

  TEST_CASE("rrelu in eval writes nothing: every way of checkpointing gives plain gradients") {
    auto body = [](const torch::Tensor& x, const torch::Tensor& w) {
      return torch::rrelu(torch::mm(x, w), 0.1, 0.3, /*training=*/false).add(1.0);
    };
    const auto plain = grads_under(body);
    CHECK(rt::bitwise_equal(plain, grads_under([&](const torch::Tensor& x, const torch::Tensor& w) {
                              return recompose::checkpoint(body, x, w);
                            })));
    CHECK(rt::bitwise_equal(plain, grads_under([&](const torch::Tensor& x, const torch::Tensor& w) {
                              return recompose::checkpoint(
                                  CheckpointOptions().policy(SelectivePolicy({"aten::mm"})), body,
                                  x, w);
                            })));
  }
}
