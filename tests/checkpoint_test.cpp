// The functional checkpoint: gradients, recomputation, early stop, lifetimes, errors, RNG.
#include "support/grad_check.h"

#include <recompose/recompose.h>

#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <functional>

#include <thread>

using recompose::CheckpointOptions;

namespace {

torch::Tensor mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& w2) {
  return torch::tanh(torch::sigmoid(x.matmul(w1)).matmul(w2)).sin();
}

struct Inputs {
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor w1 = torch::randn({8, 16}, torch::requires_grad());
  torch::Tensor w2 = torch::randn({16, 8}, torch::requires_grad());
  std::vector<torch::Tensor> all() const { return {x, w1, w2}; }
};

}  // namespace

TEST_CASE("SavedTensorMeter::holds says whether a tensor's storage is saved under it") {
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({4, 4});
  recompose::SavedTensorMeter meter;
  auto h = torch::tanh(x);   // saves nothing of x's storage
  auto y = torch::mm(h, w);  // saves h (and w, a parameter: not counted)
  CHECK(meter.holds(h));
  CHECK(meter.holds(h.view({16})));  // a view shares the storage
  CHECK_FALSE(meter.holds(x));
  CHECK_FALSE(meter.holds(w));
  CHECK_FALSE(meter.holds(torch::Tensor()));
  y.sum().backward();
  CHECK_FALSE(meter.holds(h));  // released by backward
}

TEST_CASE("checkpoint: gradients equal the uncheckpointed ones, bitwise") {
  torch::manual_seed(1);
  Inputs in;
  auto plain = rt::grads_of([&] { return mlp(in.x, in.w1, in.w2).sum(); }, in.all());
  int runs = 0;
  auto ckpt = rt::grads_of(
      [&] {
        return recompose::checkpoint(
                   [&runs](const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
                     ++runs;
                     return mlp(x, a, b);
                   },
                   in.x, in.w1, in.w2)
            .sum();
      },
      in.all());
  CHECK(rt::bitwise_equal(plain, ckpt));
  CHECK(runs == 2);  // forward + one recomputation
}

TEST_CASE("checkpoint: the region holds only its inputs for backward") {
  torch::manual_seed(2);
  Inputs in;
  int64_t plain_bytes = 0, ckpt_bytes = 0;
  in.x = torch::randn({4, 8});  // data: counted (leaves that require grad are not)
  {
    recompose::SavedTensorMeter meter;
    auto loss = mlp(in.x, in.w1, in.w2).sum();
    plain_bytes = meter.bytes_held();
    loss.backward();
    CHECK(meter.bytes_held() == 0);
  }
  {
    recompose::SavedTensorMeter meter;
    auto loss = recompose::checkpoint(mlp, in.x, in.w1, in.w2).sum();
    ckpt_bytes = meter.bytes_held();
    loss.backward();
  }
  CHECK(plain_bytes > 0);
  // The region's inputs are x (4x8 floats); parameters are never counted.
  CHECK(ckpt_bytes == static_cast<int64_t>(in.x.numel() * sizeof(float)));
  CHECK(ckpt_bytes < plain_bytes);
}

TEST_CASE("checkpoint: early stop ends the recomputation after the last needed tensor") {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({5}, torch::requires_grad());
  int reached_end = 0;
  auto fn = [&reached_end](const torch::Tensor& t) {
    torch::Tensor a = t.sin();  // saves t
    torch::Tensor b = a.cos();  // saves a
    ++reached_end;
    return b + 1;
  };
  auto expected = rt::grads_of([&] { return (x.sin().cos() + 1).sum(); }, {x});

  SUBCASE("on (default)") {
    auto g = rt::grads_of([&] { return recompose::checkpoint(fn, x).sum(); }, {x});
    CHECK(rt::bitwise_equal(g, expected));
    CHECK(reached_end == 1);  // the recomputation stopped before the end
  }
  SUBCASE("off by option") {
    auto g = rt::grads_of(
        [&] { return recompose::checkpoint(CheckpointOptions().early_stop(false), fn, x).sum(); },
        {x});
    CHECK(rt::bitwise_equal(g, expected));
    CHECK(reached_end == 2);
  }
  SUBCASE("off by the global guard, which only matters at forward time") {
    torch::Tensor loss;
    {
      auto guard = recompose::set_checkpoint_early_stop(false);
      loss = recompose::checkpoint(fn, x).sum();
    }
    loss.backward();
    CHECK(reached_end == 2);
  }
}

TEST_CASE(
    "checkpoint: early stop is skipped when the body ends with the op whose output it saved last") {
  // Stopping there would skip nothing and only cost the unwinding: the recomputation runs to the
  // end. Work that makes an autograd node after the last saved tensor is still skipped.
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({5}, torch::requires_grad());
  // The body is head, then a count of how often the body got there, then tail; returns that count
  // after a forward and backward whose gradients must equal those without checkpointing.
  using Fn = std::function<torch::Tensor(const torch::Tensor&)>;
  auto times_reached = [&x](const Fn& head, const Fn& tail) {
    int reached = 0;
    auto fn = [&](const torch::Tensor& t) {
      torch::Tensor a = head(t);
      ++reached;
      return tail(a);
    };
    auto expected = rt::grads_of([&] { return tail(head(x)).sum(); }, {x});
    auto g = rt::grads_of([&] { return recompose::checkpoint(fn, x).sum(); }, {x});
    CHECK(rt::bitwise_equal(g, expected));
    return reached;
  };
  auto identity = [](const torch::Tensor& t) { return t; };
  SUBCASE("the last op saves its output: nothing left to skip, the body runs to its end") {
    // exp saves its result, the region's output.
    CHECK(times_reached([](const torch::Tensor& t) { return t.exp(); }, identity) == 2);
  }
  SUBCASE("an op after the last saved output (it saves nothing): stopped before it") {
    // a * 2 makes an autograd node and saves no tensor.
    CHECK(times_reached([](const torch::Tensor& t) { return t.exp(); },
                        [](const torch::Tensor& a) { return a * 2; }) == 1);
  }
  SUBCASE("the last saved tensor is an op's input (the op itself is still to run): stopped") {
    // sin saves its input (exp's output) before computing.
    CHECK(times_reached([](const torch::Tensor& t) { return t.exp().sin(); }, identity) == 1);
  }
}

TEST_CASE(
    "checkpoint: with early stop, tensors the recomputation saves past the forward's count are "
    "dropped") {
  // PyTorch stops the recomputation before reaching them and succeeds ("the results would be
  // correct anyway"). Here the forward ends with the op whose output it saved last, so early stop
  // would skip nothing and the recomputation runs to its end: the extra save is dropped.
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({5}, torch::requires_grad());
  int call = 0;
  auto fn = [&call](const torch::Tensor& t) {
    torch::Tensor y = t.exp();      // saves its output: the forward's last saved tensor
    if (call++ > 0) (void)y.sin();  // the recomputation only: saves one tensor more
    return y;
  };
  auto expected = rt::grads_of([&] { return x.exp().sum(); }, {x});
  SUBCASE("early stop on (the default)") {
    std::vector<torch::Tensor> g;
    REQUIRE_NOTHROW(g = rt::grads_of([&] { return recompose::checkpoint(fn, x).sum(); }, {x}));
    CHECK(rt::bitwise_equal(g, expected));
    CHECK(call == 2);
  }
  SUBCASE("early stop off: still the error PyTorch raises") {
    auto loss = recompose::checkpoint(CheckpointOptions().early_stop(false), fn, x).sum();
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("more tensors during recomputation"),
                         recompose::CheckpointError);
  }
}

TEST_CASE("checkpoint: a second backward with retain_graph recomputes again") {
  torch::manual_seed(4);
  Inputs in;
  int runs = 0;
  auto loss = recompose::checkpoint(
                  [&runs](const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
                    ++runs;
                    return mlp(x, a, b);
                  },
                  in.x, in.w1, in.w2)
                  .sum();
  loss.backward({}, /*retain_graph=*/true);
  torch::Tensor first = in.x.grad().clone();
  loss.backward();
  CHECK(runs == 3);
  CHECK(torch::equal(in.x.grad(), first * 2));
}

namespace {
// Reads its saved tensors twice in backward: not allowed under checkpointing.
struct ReadTwice : torch::autograd::Function<ReadTwice> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto first = ctx->get_saved_variables();
    auto second = ctx->get_saved_variables();
    return {g[0] * 2};
  }
};
}  // namespace

TEST_CASE("checkpoint: a saved tensor unpacked twice in one backward is a CheckpointError") {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  auto loss =
      recompose::checkpoint([](const torch::Tensor& t) { return ReadTwice::apply(t.sin()); }, x)
          .sum();
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("already unpacked once"),
                       recompose::CheckpointError);
}

TEST_CASE("checkpoint: non-tensor arguments and outputs") {
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  torch::Tensor b = torch::randn({3}, torch::requires_grad());
  torch::Tensor e = torch::randn({3}, torch::requires_grad());
  auto body = [](const torch::Tensor& t, std::optional<torch::Tensor> bias,
                 std::vector<torch::Tensor> extra, double scale, std::string tag) {
    torch::Tensor y = t.sin() * scale;
    if (bias) y = y * bias->cos();
    for (auto& v : extra) y = y * v.exp();
    return std::make_tuple(y, tag.size(), y.tanh());
  };
  auto run = [&](bool ckpt) {
    auto out = ckpt ? recompose::checkpoint(body, x, std::optional<torch::Tensor>(b),
                                            std::vector<torch::Tensor>{e}, 0.5, std::string("abc"))
                    : body(x, b, {e}, 0.5, "abc");
    CHECK(std::get<1>(out) == 3);
    return (std::get<0>(out) + std::get<2>(out)).sum();
  };
  auto plain = rt::grads_of([&] { return run(false); }, {x, b, e});
  auto ckpt = rt::grads_of([&] { return run(true); }, {x, b, e});
  CHECK(rt::bitwise_equal(plain, ckpt));

  // an absent optional
  auto g = rt::grads_of(
      [&] {
        return std::get<0>(recompose::checkpoint(body, x, std::optional<torch::Tensor>(),
                                                 std::vector<torch::Tensor>{}, 2.0, std::string()))
            .sum();
      },
      {x});
  CHECK(torch::allclose(g[0], (x.cos() * 2).detach()));
}

TEST_CASE("checkpoint: inputs that do not require grad, and outputs that do not") {
  torch::manual_seed(6);
  torch::Tensor x = torch::randn({4, 8});  // data: no grad
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  auto plain = rt::grads_of([&] { return x.matmul(w).relu().sum(); }, {w});
  auto ckpt = rt::grads_of(
      [&] {
        return recompose::checkpoint([&w](const torch::Tensor& t) { return t.matmul(w).relu(); }, x)
            .sum();
      },
      {w});
  CHECK(rt::bitwise_equal(plain, ckpt));

  torch::Tensor out = recompose::checkpoint([](const torch::Tensor& t) { return t * 2; }, x);
  CHECK_FALSE(out.requires_grad());
  CHECK(torch::equal(out, x * 2));
}

TEST_CASE("checkpoint: under no_grad and inference mode the body just runs") {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  int runs = 0;
  bool inside = true;
  auto fn = [&](const torch::Tensor& t) {
    ++runs;
    inside = recompose::is_checkpointing();
    return t * 3;
  };
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(recompose::checkpoint(fn, x), x * 3));
  }
  CHECK_FALSE(inside);
  {
    c10::InferenceMode guard;
    torch::Tensor y = torch::ones({2});
    CHECK(torch::equal(recompose::checkpoint(fn, y), y * 3));
  }
  CHECK(runs == 2);
  CHECK_FALSE(inside);
}

TEST_CASE("checkpoint: is_checkpointing and is_recomputing inside the body") {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  std::vector<std::pair<bool, bool>> seen;
  auto loss = recompose::checkpoint(
                  [&](const torch::Tensor& t) {
                    seen.emplace_back(recompose::is_checkpointing(), recompose::is_recomputing());
                    return t.sin();
                  },
                  x)
                  .sum();
  CHECK_FALSE(recompose::is_checkpointing());
  loss.backward();
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::make_pair(true, false));
  CHECK(seen[1].second);
  CHECK_FALSE(recompose::is_recomputing());
}

TEST_CASE("checkpoint: determinism check names the position and both metadata") {
  torch::Tensor x = torch::randn({4}, torch::requires_grad());
  SUBCASE("shape differs") {
    int call = 0;
    auto loss = recompose::checkpoint(
        [&call](const torch::Tensor& t) {
          torch::Tensor u = call++ == 0 ? t : torch::cat({t, t});
          return u.sin().sum();
        },
        x);
    try {
      loss.backward();
      FAIL("expected a CheckpointError");
    } catch (const recompose::CheckpointError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("tensor at position 0") != std::string::npos);
      CHECK(msg.find("shape: [4]") != std::string::npos);
      CHECK(msg.find("shape: [8]") != std::string::npos);
      CHECK(msg.find("debug(true)") != std::string::npos);  // the tip
    }
  }
  SUBCASE("debug mode lists the ops of forward and recomputation") {
    int call = 0;
    auto loss = recompose::checkpoint(
        CheckpointOptions().debug(true),
        [&call](const torch::Tensor& t) {
          return call++ == 0 ? t.sin().sum() : torch::cat({t, t}).exp().sum();
        },
        x);
    try {
      loss.backward();
      FAIL("expected a CheckpointError");
    } catch (const recompose::CheckpointError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("Operations executed during the original forward") != std::string::npos);
      CHECK(msg.find("aten::sin") != std::string::npos);
      CHECK(msg.find("aten::exp") != std::string::npos);
    }
  }
  SUBCASE("the global debug guard at forward time does the same") {
    int call = 0;
    torch::Tensor loss;
    {
      auto guard = recompose::set_checkpoint_debug_enabled(true);
      loss = recompose::checkpoint(
          [&call](const torch::Tensor& t) {
            return call++ == 0 ? t.sin().sum() : torch::cat({t, t}).exp().sum();
          },
          x);
    }
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("aten::exp"),
                         recompose::CheckpointError);
  }
  SUBCASE("a different number of saved tensors") {
    int call = 0;
    auto loss = recompose::checkpoint(
        CheckpointOptions().early_stop(false),
        [&call](const torch::Tensor& t) {
          return call++ == 0 ? t.sin().sum() : t.sin().cos().sum();
        },
        x);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("more tensors during recomputation"),
                         recompose::CheckpointError);
  }
  SUBCASE("DeterminismCheck::None skips the metadata comparison") {
    int call = 0;
    auto loss = recompose::checkpoint(
        CheckpointOptions().determinism_check(recompose::DeterminismCheck::None),
        [&call](const torch::Tensor& t) {
          torch::Tensor u = call++ == 0 ? t : t.to(torch::kDouble);
          return u.sin().sum();
        },
        x);
    CHECK_NOTHROW(loss.backward());
  }
}

TEST_CASE("checkpoint: RNG state is restored so dropout masks match") {
  torch::Tensor x = torch::randn({64}, torch::requires_grad());
  auto body = [](const torch::Tensor& t) {
    return torch::dropout(t.sin(), 0.5, /*train=*/true).cos();
  };
  torch::manual_seed(7);
  auto plain = rt::grads_of([&] { return body(x).sum(); }, {x});
  torch::manual_seed(7);
  auto ckpt = rt::grads_of([&] { return recompose::checkpoint(body, x).sum(); }, {x});
  CHECK(rt::bitwise_equal(plain, ckpt));
  // Without preserving the state the recomputation draws another mask.
  torch::manual_seed(7);
  auto unpreserved = rt::grads_of(
      [&] {
        return recompose::checkpoint(CheckpointOptions().preserve_rng_state(false), body, x).sum();
      },
      {x});
  CHECK_FALSE(rt::bitwise_equal(plain, unpreserved));
}

TEST_CASE(
    "checkpoint: the generator ends backward where it was, whether or not it held the forward's "
    "state") {
  // The recomputation writes the forward's RNG state only when the generator holds another one,
  // and writes the state it found back only when it wrote or the recomputation drew.
  torch::Tensor x = torch::randn({64}, torch::requires_grad());
  auto drawing = [](const torch::Tensor& t) {
    return torch::dropout(t.sin(), 0.5, /*train=*/true).cos();
  };
  auto quiet = [](const torch::Tensor& t) { return t.sin().cos(); };
  auto generator_state = [] { return at::detail::getDefaultCPUGenerator().get_state(); };
  for (bool draws : {true, false}) {
    CAPTURE(draws);
    using Fn = std::function<torch::Tensor(const torch::Tensor&)>;
    const Fn body = draws ? Fn(drawing) : Fn(quiet);
    torch::manual_seed(11);
    const at::Tensor at_entry = generator_state();
    torch::Tensor plain_grad = rt::grads_of([&] { return body(x).sum(); }, {x})[0];
    // The region's forward from `at_entry`, then backward with the generator at `at_backward`.
    auto check_backward_from = [&](const at::Tensor& at_backward) {
      torch::manual_seed(11);
      torch::Tensor y = recompose::checkpoint(body, x).sum();
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(at_backward);
      x.mutable_grad() = torch::Tensor();
      y.backward();
      CHECK(torch::equal(generator_state(), at_backward));
      CHECK(torch::equal(x.grad(), plain_grad));
    };
    SUBCASE("backward finds the forward's state in place") { check_backward_from(at_entry); }
    SUBCASE("backward finds another state") {
      torch::manual_seed(12);
      check_backward_from(generator_state());
    }
  }
}

TEST_CASE("checkpoint: autocast state of the forward is restored for the recomputation") {
  torch::manual_seed(8);
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  auto body = [&w](const torch::Tensor& t) { return t.matmul(w).relu().to(torch::kFloat); };
  auto with_autocast = [](auto fn) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    auto out = fn();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    return out;
  };
  auto plain = rt::grads_of([&] { return with_autocast([&] { return body(x); }).sum(); }, {x, w});
  // backward runs with autocast off: the recomputation must still use bf16 as the forward did
  auto ckpt = rt::grads_of(
      [&] { return with_autocast([&] { return recompose::checkpoint(body, x); }).sum(); }, {x, w});
  CHECK(rt::bitwise_equal(plain, ckpt));
}

TEST_CASE("checkpoint: an exception in the body leaves no region behind") {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  CHECK_THROWS_WITH(
      recompose::checkpoint(
          [](const torch::Tensor&) -> torch::Tensor { throw std::runtime_error("boom"); }, x),
      "boom");
  CHECK_FALSE(recompose::is_checkpointing());
  // tensors saved now are saved normally
  recompose::SavedTensorMeter meter;
  auto y = (x * 2).sin();
  CHECK(meter.bytes_held() > 0);
  auto g = rt::grads_of(
      [&] {
        return recompose::checkpoint([](const torch::Tensor& t) { return t.sin(); }, x).sum();
      },
      {x});
  CHECK(torch::equal(g[0], x.cos().detach()));
}

TEST_CASE("checkpoint: backward on another thread than the forward") {
  torch::manual_seed(9);
  Inputs in;
  auto plain = rt::grads_of([&] { return mlp(in.x, in.w1, in.w2).sum(); }, in.all());
  for (auto t : in.all()) t.mutable_grad() = torch::Tensor();
  auto loss = recompose::checkpoint(mlp, in.x, in.w1, in.w2).sum();
  std::thread([&] { loss.backward(); }).join();
  std::vector<torch::Tensor> got;
  for (auto& t : in.all()) got.push_back(t.grad());
  CHECK(rt::bitwise_equal(plain, got));
}

TEST_CASE("checkpoint_sequential: gradients equal; bad segment counts are refused") {
  torch::manual_seed(10);
  torch::nn::Sequential seq(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                            torch::nn::GELU(), torch::nn::Linear(16, 8), torch::nn::Sigmoid());
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  auto params = seq->parameters();
  params.push_back(x);
  auto plain = rt::grads_of([&] { return seq->forward(x).sum(); }, params);
  for (int64_t segments : {1, 2, 3, 6}) {
    CAPTURE(segments);
    auto ckpt = rt::grads_of(
        [&] { return recompose::checkpoint_sequential(seq, segments, x).sum(); }, params);
    CHECK(rt::bitwise_equal(plain, ckpt));
  }
  CHECK_THROWS_AS(recompose::checkpoint_sequential(seq, 0, x), std::invalid_argument);
  CHECK_THROWS_AS(recompose::checkpoint_sequential(seq, 7, x), std::invalid_argument);
}

namespace {
struct CountingContexts : recompose::RegionContexts {
  std::vector<std::string>* log;
  explicit CountingContexts(std::vector<std::string>* l) : log(l) {}
  std::shared_ptr<void> enter_forward() override {
    log->push_back("enter forward");
    return std::shared_ptr<void>(nullptr, [l = log](void*) { l->push_back("leave forward"); });
  }
  std::shared_ptr<void> enter_recompute() override {
    log->push_back(recompose::is_recomputing() ? "enter recompute"
                                               : "enter recompute (wrong state)");
    return std::shared_ptr<void>(nullptr, [l = log](void*) { l->push_back("leave recompute"); });
  }
};
}  // namespace

TEST_CASE("checkpoint: context_fn contexts wrap the forward and each recomputation") {
  torch::Tensor x = torch::randn({3}, torch::requires_grad());
  std::vector<std::string> log;
  auto opts =
      CheckpointOptions().context_fn([&log] { return std::make_shared<CountingContexts>(&log); });
  auto loss = recompose::checkpoint(
                  opts,
                  [&log](const torch::Tensor& t) {
                    log.push_back("body");
                    return t.sin();
                  },
                  x)
                  .sum();
  loss.backward();
  REQUIRE(log.size() == 6);
  CHECK(log[0] == "enter forward");
  CHECK(log[1] == "body");
  CHECK(log[2] == "leave forward");
  CHECK(log[3] ==
        "enter recompute");  // entered inside the recomputation (is_recomputing() is true)
  CHECK(log[4] == "body");
  CHECK(log[5] == "leave recompute");
}

#ifdef RECOMPOSE_TEST_NO_SWAP
TEST_CASE("core build: swap_inputs without activation swap is a CheckpointError saying so") {
  auto x = torch::randn({3}, torch::requires_grad());
  CHECK_THROWS_WITH_AS(recompose::checkpoint(
                           recompose::CheckpointOptions().swap_inputs(true),
                           [](const torch::Tensor& t) { return t.sin(); }, x),
                       doctest::Contains("-Dswap=disabled"), recompose::CheckpointError);
}
#endif
