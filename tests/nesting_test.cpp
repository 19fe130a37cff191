// NOTE [ Nestable Checkpoint ] rules 1-6: nested regions, recomputation from scratch, lifetimes,
// early stop, and backward inside a region's forward.
#include "support/grad_check.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

using recompose::CheckpointOptions;

TEST_CASE(
    "nesting: an inner region inside an outer one; gradients equal, inputs go to the parent") {
  torch::manual_seed(11);
  torch::Tensor x = torch::randn({4, 6}, torch::requires_grad());
  torch::Tensor w = torch::randn({6, 6}, torch::requires_grad());
  int outer_runs = 0, inner_runs = 0;
  auto inner = [&](const torch::Tensor& h) {
    ++inner_runs;
    return torch::tanh(h.matmul(w)).sin();
  };
  auto outer = [&](const torch::Tensor& t) {
    ++outer_runs;
    torch::Tensor h = t.matmul(w).sigmoid();
    torch::Tensor g = recompose::checkpoint(inner, h);  // h: saved to the outer region (rule 2)
    return (g * h).cos();
  };
  auto plain = rt::grads_of(
      [&] {
        torch::Tensor h = x.matmul(w).sigmoid();
        return (torch::tanh(h.matmul(w)).sin() * h).cos().sum();
      },
      {x, w});
  recompose::SavedTensorMeter meter;
  torch::Tensor x_in = x * 1.0;  // a non-leaf input, so the meter counts it
  auto loss = recompose::checkpoint(outer, x_in).sum();
  // Only the outer region's input is held: the inner region's input h is a tensor saved to the
  // outer region, so it costs nothing either.
  CHECK(meter.bytes_held() == static_cast<int64_t>(x.numel() * sizeof(float)));
  for (auto t : {x, w}) t.mutable_grad() = torch::Tensor();
  loss.backward();
  CHECK(rt::bitwise_equal(plain, {x.grad(), w.grad()}));
  CHECK(outer_runs == 2);
  // forward, the outer recomputation (which meets the inner region, rule 3), and the inner
  // recomputation its own saved tensors need.
  CHECK(inner_runs == 3);
}

TEST_CASE("nesting: three levels deep, with early stop on and off") {
  torch::manual_seed(12);
  torch::Tensor x = torch::randn({8}, torch::requires_grad());
  auto level3 = [](const torch::Tensor& t) { return t.sin().exp(); };
  auto level2 = [&](const torch::Tensor& t) {
    return recompose::checkpoint(level3, t.cos()).tanh();
  };
  auto level1 = [&](const torch::Tensor& t) {
    return recompose::checkpoint(level2, t.sigmoid()) * t;
  };
  auto plain = rt::grads_of(
      [&] {
        torch::Tensor s = x.sigmoid();
        return ((s.cos().sin().exp()).tanh() * x).sum();
      },
      {x});
  for (bool early : {true, false}) {
    CAPTURE(early);
    auto g = rt::grads_of(
        [&] {
          return recompose::checkpoint(CheckpointOptions().early_stop(early), level1, x).sum();
        },
        {x});
    CHECK(rt::bitwise_equal(plain, g));
  }
}

TEST_CASE("rule 4: recomputed tensors are cleared as they are unpacked, even with retain_graph") {
  torch::manual_seed(13);
  torch::Tensor x = torch::randn({16}, torch::requires_grad());
  auto fn = [](const torch::Tensor& t) { return t.sin().cos().exp(); };
  auto loss = recompose::checkpoint(fn, x).sum();
  loss.backward({}, /*retain_graph=*/true);
  torch::Tensor g1 = x.grad().clone();
  // A second backward must recompute (nothing of the first recomputation stayed alive) and give
  // the same gradient again.
  loss.backward({}, /*retain_graph=*/true);
  CHECK(torch::equal(x.grad(), g1 * 2));
  loss.backward();
  CHECK(torch::equal(x.grad(), g1 * 3));
}

TEST_CASE("rule 6: torch::autograd::grad inside a region's forward, retain_graph true") {
  torch::manual_seed(14);
  torch::Tensor x = torch::randn({5}, torch::requires_grad());
  auto fn = [](const torch::Tensor& t) {
    torch::Tensor y = t.sin();
    torch::Tensor z = y.cos();
    torch::Tensor gx =
        torch::autograd::grad({z.sum()}, {t}, {}, /*retain_graph=*/true, /*create_graph=*/false)[0];
    return gx * z;
  };
  auto plain = rt::grads_of([&] { return fn(x).sum(); }, {x});
  for (bool early : {true, false}) {
    CAPTURE(early);
    auto g = rt::grads_of(
        [&] { return recompose::checkpoint(CheckpointOptions().early_stop(early), fn, x).sum(); },
        {x});
    CHECK(rt::bitwise_equal(plain, g));
  }
}

TEST_CASE(
    "rule 6: backward inside a region's forward, retain_graph false, then the outer backward") {
  torch::manual_seed(15);
  torch::Tensor x = torch::randn({5}, torch::requires_grad());
  auto fn = [](const torch::Tensor& t) {
    torch::Tensor y = t.sin();
    torch::Tensor z = y.cos();
    torch::Tensor gx = torch::autograd::grad({z.sum()}, {t})[0];
    return t.cos() * gx;
  };
  auto plain = rt::grads_of([&] { return fn(x).sum(); }, {x});
  for (bool early : {true, false}) {
    CAPTURE(early);
    auto g = rt::grads_of(
        [&] { return recompose::checkpoint(CheckpointOptions().early_stop(early), fn, x).sum(); },
        {x});
    CHECK(rt::bitwise_equal(plain, g));
  }
}

TEST_CASE("nesting: a region inside the recomputation of another is respected (rule 3)") {
  torch::manual_seed(16);
  torch::Tensor x = torch::randn({6}, torch::requires_grad());
  std::vector<bool> inner_saw_recompute;
  auto inner = [&](const torch::Tensor& t) {
    inner_saw_recompute.push_back(recompose::is_recomputing());
    return t.exp();
  };
  auto outer = [&](const torch::Tensor& t) { return recompose::checkpoint(inner, t.sin()).cos(); };
  auto loss = recompose::checkpoint(outer, x).sum();
  loss.backward();
  REQUIRE(inner_saw_recompute.size() >= 2);
  CHECK_FALSE(inner_saw_recompute[0]);
  CHECK(inner_saw_recompute[1]);
  CHECK(torch::allclose(x.grad(), (-x.sin().exp().sin() * x.sin().exp() * x.cos()).detach()));
}
