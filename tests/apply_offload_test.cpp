// Composable activation offload (recompose/apply_offload.h) on CPU tensors: host-to-host copies,
// the same grouping, deferral and prefetch logic as on a GPU.
#include <recompose/apply_offload.h>
#include <recompose/recompose.h>

#include <c10/util/Exception.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "support/grad_check.h"
#include "support/test_modules.h"
#include "swap/never_stall_plan.h"  // NeverStallPlan, fits_window: the decision on its own
#include "swap/swap_access.h"  // SwapAccess::core: SwapCore::bookkeeping_entries, for the leak check
#include "swap/swap_core.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kBatch = 8;
constexpr int64_t kWidth = 16;
constexpr int64_t kActivationBytes = kBatch * kWidth * 4;  // one float activation of a block

// Saves two activations of its own for backward: fc's input (x * 2, a fresh tensor: mul by a
// scalar saves nothing) and tanh's output. fc's weight (a parameter) is saved too, and stays.
struct OffloadBlockImpl : torch::nn::Module {
  OffloadBlockImpl() { fc = register_module("fc", torch::nn::Linear(kWidth, kWidth)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    ++body_runs;
    // A longer forward: a wider copy window for the never-stall offload, which measures it.
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return torch::tanh(fc->forward(x * 2));
  }
  torch::nn::Linear fc{nullptr};
  int body_runs = 0;
  int sleep_ms = 0;
};
TORCH_MODULE(OffloadBlock);

struct Stack {
  explicit Stack(int64_t n) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < n; ++i) blocks.emplace_back();
  }
  // Runs the blocks; `outputs` receives each block's output.
  torch::Tensor forward(torch::Tensor x, std::vector<torch::Tensor>* outputs = nullptr) {
    for (auto& b : blocks) {
      x = b(x);
      if (outputs) outputs->push_back(x);
    }
    return x;
  }
  std::vector<torch::Tensor> params() {
    std::vector<torch::Tensor> out;
    for (auto& b : blocks) {
      for (auto& p : b->parameters()) out.push_back(p);
    }
    return out;
  }
  std::vector<OffloadBlock> blocks;
};

std::shared_ptr<recompose::SwapManager> test_manager(int64_t prefetch_groups = 1) {
  return recompose::SwapManager::create(
      recompose::SwapOptions().min_bytes(0).prefetch_groups(prefetch_groups));
}

std::vector<torch::Tensor> with(std::vector<torch::Tensor> v, const torch::Tensor& t) {
  v.push_back(t);
  return v;
}

std::vector<torch::Tensor> plain_grads(Stack& s, const torch::Tensor& x) {
  return rt::grads_of([&] { return s.forward(x * 1).pow(2).sum(); }, with(s.params(), x));
}

}  // namespace

TEST_SUITE_BEGIN("apply_offload");

TEST_CASE("apply_offload: gradients are bitwise those of the plain forward, step after step") {
  Stack s(4);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  const auto expected = plain_grads(s, x);
  auto manager = test_manager();
  const int64_t baseline = recompose::detail::SwapAccess::core(*manager)->bookkeeping_entries();
  for (bool keep_last : {true, false}) {
    for (auto& b : s.blocks) {
      recompose::apply_offload(
          b, recompose::OffloadOptions().manager(manager).keep_last_on_device(keep_last));
    }
    for (int step = 0; step < 3; ++step) {
      CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
      // Nothing of a step outlives it: no offloaded tensor, no table entry.
      CHECK(manager->tensors_alive() == 0);
      CHECK(recompose::detail::SwapAccess::core(*manager)->bookkeeping_entries() == baseline);
    }
    for (auto& b : s.blocks) CHECK(recompose::remove_offload(b));
  }
  // The module tree and parameter names are unchanged.
  CHECK(s.blocks[0]->named_parameters().size() == 2);
  CHECK(s.blocks[0]->named_parameters().contains("fc.weight"));
}

TEST_CASE("apply_offload: counts per module, and the last call stays on the device") {
  Stack s(4);
  auto manager = test_manager();
  for (auto& b : s.blocks)
    recompose::apply_offload(b, recompose::OffloadOptions().manager(manager));
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  auto loss = s.forward(x * 1).pow(2).sum();
  // Block i's copies start when block i+1 begins: blocks 0..2 are offloaded by now, block 3 not.
  CHECK(manager->stats().tensors_offloaded == 6);
  CHECK(manager->stats().groups == 3);
  loss.backward();
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    CAPTURE(i);
    const auto st = recompose::offload_stats(*s.blocks[i]);
    const bool last = i + 1 == s.blocks.size();
    CHECK(st.calls == 1);
    CHECK(st.tensors_offloaded == (last ? 0 : 2));
    CHECK(st.bytes_offloaded == (last ? 0 : 2 * kActivationBytes));
    CHECK(st.tensors_left_on_device == (last ? 2 : 0));
    CHECK(st.bytes_left_on_device == (last ? 2 * kActivationBytes : 0));
    // fc's weight (saved as a view of a parameter) is not eligible.
    CHECK(st.tensors_kept == 1);
    CHECK(st.bytes_kept == kWidth * kWidth * 4);
  }
  CHECK(manager->stats().bytes_reloaded == manager->stats().bytes_offloaded);
  recompose::reset_offload_stats(*s.blocks[0]);
  CHECK(recompose::offload_stats(*s.blocks[0]).calls == 0);
}

TEST_CASE("apply_offload: a SavedTensorMeter counts what offload keeps on the device") {
  // min_bytes above every activation: nothing moves, so the meter must read as without offload.
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  int64_t plain = 0;
  {
    Stack s(3);
    recompose::SavedTensorMeter meter;
    auto loss = s.forward(x * 1).pow(2).sum();
    plain = meter.peak_bytes_held();
    loss.backward();
  }
  struct Warnings : c10::WarningHandler {
    std::vector<std::string> messages;
    void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
  } warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  Stack s(3);
  auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(1 << 20));
  for (auto& b : s.blocks)
    recompose::apply_offload(b, recompose::OffloadOptions().manager(manager));
  recompose::SavedTensorMeter meter;
  auto loss = s.forward(x * 1).pow(2).sum();
  CHECK(manager->stats().tensors_offloaded == 0);
  CHECK(meter.peak_bytes_held() == plain);
  loss.backward();
  CHECK(meter.bytes_held() == 0);  // refunded with the saved tensors
  // Each module says once that its offload moved nothing, and why.
  s.forward(x * 1).pow(2).sum().backward();
  REQUIRE(warnings.messages.size() == 3);
  CHECK(warnings.messages[0].find("moved none of the 2 activations") != std::string::npos);
  CHECK(warnings.messages[0].find("min_bytes (1.00 MiB)") != std::string::npos);
}

TEST_CASE("apply_offload: the forward order of the modules is the prefetch order of backward") {
  for (bool keep_last : {true, false}) {
    CAPTURE(keep_last);
    Stack s(4);
    auto manager = test_manager(/*prefetch_groups=*/1);
    for (auto& b : s.blocks) {
      recompose::apply_offload(
          b, recompose::OffloadOptions().manager(manager).keep_last_on_device(keep_last));
    }
    auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
    std::vector<torch::Tensor> outputs;
    auto loss = s.forward(x * 1, &outputs).pow(2).sum();
    // The gradient of block i's output is ready once block i+1's backward is done: what has been
    // reloaded by then.
    std::vector<recompose::SwapStats> seen(outputs.size());
    for (size_t i = 0; i + 1 < outputs.size(); ++i) {
      outputs[i].register_hook(
          [&seen, &manager, i](const torch::Tensor&) { seen[i] = manager->stats(); });
    }
    loss.backward();
    // Each block's group is reloaded, ahead of need, while the block after it runs backward:
    // block 2's during block 3's, block 1's during block 2's, block 0's during block 1's.
    const int64_t last_group = keep_last ? 0 : 2;  // block 3's own tensors, when it was offloaded
    CHECK(seen[2].tensors_reloaded == last_group + 2);
    CHECK(seen[1].tensors_reloaded == last_group + 4);
    CHECK(seen[0].tensors_reloaded == last_group + 6);
    const auto end = manager->stats();
    CHECK(end.tensors_reloaded == last_group + 6);
    // Only the first tensor backward asks for, in the last block, can be loaded on demand.
    CHECK(end.sync_loads == (keep_last ? 0 : 1));
    CHECK(end.prefetched == end.tensors_reloaded - end.sync_loads);
  }
}

TEST_CASE("apply_offload: a per-tensor policy keeps what it says on the device") {
  Stack s(3);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  const auto expected = plain_grads(s, x);
  auto manager = test_manager();
  // Each block asks about two eligible tensors (fc's input, then tanh's output): swap the first,
  // keep the second.
  int64_t asked = 0;
  auto policy = [&asked](const at::Tensor&) {
    return ++asked % 2 == 1 ? recompose::ActivationPolicy::SWAP : recompose::ActivationPolicy::SAVE;
  };
  for (auto& b : s.blocks) {
    recompose::apply_offload(
        b, recompose::OffloadOptions().manager(manager).policy(policy).keep_last_on_device(false));
  }
  CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
  CHECK(asked == 6);  // asked for every eligible tensor, never for fc's weight
  for (auto& b : s.blocks) {
    const auto st = recompose::offload_stats(*b);
    CHECK(st.tensors_offloaded == 1);
    CHECK(st.tensors_kept == 2);  // fc's weight (not eligible) and what the policy kept
    CHECK(st.bytes_kept == kWidth * kWidth * 4 + kActivationBytes);
  }
}

TEST_CASE("apply_offload: composes with apply_checkpoint on the same modules, in either order") {
  for (bool checkpoint_first : {true, false}) {
    CAPTURE(checkpoint_first);
    Stack s(3);
    auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
    const auto expected = plain_grads(s, x);
    auto manager = test_manager();
    for (auto& b : s.blocks) {
      if (checkpoint_first) recompose::apply_checkpoint(b);
      recompose::apply_offload(
          b, recompose::OffloadOptions().manager(manager).keep_last_on_device(false));
      if (!checkpoint_first) recompose::apply_checkpoint(b);
      b->body_runs = 0;
    }
    CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
    for (auto& b : s.blocks) {
      CHECK(b->body_runs == 2);  // forward and recomputation
      // The region keeps only its input, and that is what goes to host memory.
      const auto st = recompose::offload_stats(*b);
      CHECK(st.calls == 1);
      CHECK(st.tensors_offloaded == 1);
      CHECK(st.bytes_offloaded == kActivationBytes);
    }
    CHECK(manager->tensors_alive() == 0);
  }
}

TEST_CASE(
    "apply_offload: does nothing inside a checkpointed region, during recomputation, or without "
    "grad") {
  rt::Nested parent;
  auto manager = test_manager();
  recompose::apply_offload(parent->a, recompose::OffloadOptions().manager(manager));
  auto x = torch::randn({4, 4}, torch::requires_grad());
  const auto leaves = with(parent->parameters(), x);
  const auto expected = rt::grads_of([&] { return parent(x * 1).sum(); }, leaves);
  recompose::reset_offload_stats(*parent->a);
  recompose::apply_checkpoint(parent);
  CHECK(rt::bitwise_equal(rt::grads_of([&] { return parent(x * 1).sum(); }, leaves), expected));
  CHECK(recompose::offload_stats(*parent->a).calls == 0);
  CHECK(manager->stats().tensors_offloaded == 0);
  {
    torch::NoGradGuard no_grad;
    parent->a(x);
  }
  CHECK(recompose::offload_stats(*parent->a).calls == 0);
}

TEST_CASE("apply_offload: backward twice with retain_graph, and a tensor modified in place") {
  Stack s(3);
  auto manager = test_manager();
  for (auto& b : s.blocks)
    recompose::apply_offload(b, recompose::OffloadOptions().manager(manager));
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  auto loss = s.forward(x * 1).pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  const auto first = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  loss.backward();
  CHECK(torch::equal(x.grad(), first));

  // An activation saved by block 0 (tanh's output) modified in place before backward.
  std::vector<torch::Tensor> outputs;
  auto bad = s.forward(x * 1, &outputs).pow(2).sum();
  {
    torch::NoGradGuard no_grad;
    outputs[0].add_(1);
  }
  CHECK_THROWS_WITH_AS(bad.backward(), doctest::Contains("modified by an inplace operation"),
                       recompose::CheckpointError);
}

TEST_CASE("apply_offload: a forward that throws leaves no scope behind") {
  rt::Throwing thrower;
  auto manager = test_manager();
  recompose::apply_offload(thrower, recompose::OffloadOptions().manager(manager));
  auto x = torch::randn({4, 4}, torch::requires_grad());
  CHECK_THROWS_WITH(thrower(x * 1, true), "body failed");
  // The next forward and backward work: the failed call's policy scope was closed.
  auto y = thrower(x * 1, false);
  y.sin().sum().backward();
  CHECK(torch::allclose(x.grad(), 2 * (2 * x).cos()));
}

TEST_CASE("apply_offload: misuse gives clear errors") {
  OffloadBlock block;
  recompose::apply_offload(block);
  CHECK(recompose::is_offloaded(*block));
  CHECK_THROWS_AS(recompose::apply_offload(block), recompose::hooks::CompositionError);
  CHECK(recompose::remove_offload(block));
  CHECK_FALSE(recompose::remove_offload(block));
  CHECK_FALSE(recompose::is_offloaded(*block));
  CHECK_THROWS_WITH_AS(recompose::offload_stats(*block), doctest::Contains("apply_offload"),
                       recompose::CheckpointError);
  auto plain = std::make_shared<torch::nn::LinearImpl>(2, 2);  // forward not annotated
  CHECK_THROWS_AS(recompose::apply_offload(plain), std::invalid_argument);
}

// Never-stall mode (issue 27). A block saves two eligible activations of 512 bytes each.
TEST_CASE(
    "apply_offload never-stall: only what the window hides goes; the rest stays and is reported") {
  struct Case {
    const char* what;
    recompose::LinkModel link;
    double forward_window, backward_window;
    int64_t offloaded;  // per block but the last
  };
  const Case cases[] = {
      // 0.75 MB/s: one activation takes 0.68 ms, two 1.37 ms, against a 1 ms forward window.
      {"bandwidth", recompose::LinkModel::symmetric(0.75e6), 1e-3, 0, 1},
      // Fast link, 0.7 ms per copy: one copy fits 1 ms, two do not.
      {"cost per copy", recompose::LinkModel::symmetric(1e12, 0.7e-3), 1e-3, 0, 1},
      // Out fits, back does not (slow host-to-device, 1 ms backward window).
      {"backward window", recompose::LinkModel{1e12, 0.75e6, 0}, 1, 1e-3, 1},
      {"everything fits", recompose::LinkModel::symmetric(1e12), 1, 0, 2},
      {"nothing fits", recompose::LinkModel::symmetric(1e3), 1e-3, 0, 0},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Stack s(4);
    auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
    const auto expected = plain_grads(s, x);
    auto manager = test_manager();
    for (auto& b : s.blocks) {
      recompose::apply_offload(b, recompose::OffloadOptions()
                                      .manager(manager)
                                      .never_stall(c.link)
                                      .forward_window_seconds(c.forward_window)
                                      .backward_window_seconds(c.backward_window));
    }
    CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      CAPTURE(i);
      const auto st = recompose::offload_stats(*s.blocks[i]);
      const bool last = i + 1 == s.blocks.size();  // keep_last_on_device: never launched
      CHECK(st.tensors_offloaded == (last ? 0 : c.offloaded));
      CHECK(st.bytes_offloaded == (last ? 0 : c.offloaded * kActivationBytes));
      CHECK(st.tensors_over_window == (last ? 0 : 2 - c.offloaded));
      CHECK(st.bytes_over_window == (last ? 0 : (2 - c.offloaded) * kActivationBytes));
      CHECK(st.tensors_left_on_device == (last ? 2 : 0));
      CHECK(st.window_seconds == doctest::Approx(c.forward_window));
      // CPU copies are synchronous: every launched copy is seen landed, with its time.
      CHECK(st.bytes_landed == st.bytes_offloaded);
      if (st.bytes_offloaded > 0) CHECK(st.achieved_bytes_per_second() > 0);
    }
    CHECK(manager->tensors_alive() == 0);
  }
}

TEST_CASE("apply_offload never-stall: measured windows, and a report per module and per step") {
  Stack s(3);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  const auto expected = plain_grads(s, x);
  for (double bandwidth : {1e15, 1.0}) {
    CAPTURE(bandwidth);
    auto manager = test_manager();
    for (auto& b : s.blocks) {
      // No window given: each call's own forward time (microseconds here) is its window.
      recompose::apply_offload(
          b, recompose::OffloadOptions().manager(manager).keep_last_on_device(false).never_stall(
                 recompose::LinkModel::symmetric(bandwidth)));
    }
    CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
    const bool fast = bandwidth > 1;
    for (auto& b : s.blocks) {
      const auto st = recompose::offload_stats(*b);
      CHECK(st.window_seconds > 0);
      CHECK(st.tensors_offloaded == (fast ? 2 : 0));
      CHECK(st.tensors_over_window == (fast ? 0 : 2));
    }
    // A module of its own is a tree of one: its report has its row and the total.
    const auto report = recompose::offload_report(*s.blocks[0]);
    CHECK(report.find("(root)") != std::string::npos);
    CHECK(report.find("total") != std::string::npos);
    CHECK(recompose::total_offload_stats(*s.blocks[1]).tensors_offloaded == (fast ? 2 : 0));
    for (auto& b : s.blocks) recompose::remove_offload(b);
  }
  CHECK_THROWS_AS(recompose::apply_offload(
                      s.blocks[0], recompose::OffloadOptions().never_stall(recompose::LinkModel{})),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      recompose::apply_offload(s.blocks[0], recompose::OffloadOptions().forward_window_seconds(-1)),
      std::invalid_argument);
  CHECK_FALSE(recompose::is_offloaded(*s.blocks[0]));
}

// Issue 45: the never-stall offload decides once. See Note [ Never-stall offload decides once ].
TEST_CASE("never-stall decision: warm-up, the shortest windows decide, one decision per shape") {
  using recompose::detail::CopyWindow;
  using recompose::detail::fits_window;
  using recompose::detail::NeverStallPlan;
  // The rule: in saved order, each tensor while the running total fits both windows; a tensor
  // that does not fit stays, a later smaller one may still go; 0 bytes is no copy.
  const auto slow = recompose::LinkModel::symmetric(1e3);  // 1 ms per byte
  CHECK(fits_window({5, 0, 100, 5}, CopyWindow{slow, 12e-3, 1}) ==
        std::vector<bool>{true, false, false, true});
  CHECK(fits_window({5, 5}, CopyWindow{slow, 1, 7e-3}) == std::vector<bool>{true, false});
  CHECK(fits_window({5, 5}, CopyWindow{recompose::LinkModel::symmetric(1e15, 6e-3), 12.1e-3, 1}) ==
        std::vector<bool>{true, true});

  const auto link = recompose::LinkModel::symmetric(1e15, 1e-3);  // 1 ms per copy
  auto window = [&](double forward) { return CopyWindow{link, forward, 2 * forward}; };
  NeverStallPlan plan(4);
  const std::vector<int64_t> shape{100, 200, 300};
  // Three calls choose by their own windows; the fourth decides from the shortest (1.5 ms: one
  // copy), however long its own window.
  CHECK_FALSE(plan.choose(shape, window(5e-3)).moves);
  CHECK_FALSE(plan.choose(shape, window(1.5e-3)).moves);
  CHECK_FALSE(plan.choose(shape, window(9e-3)).moves);
  const auto decided = plan.choose(shape, window(20e-3));
  REQUIRE(decided.moves);
  CHECK(decided.decided_now);
  CHECK(*decided.moves == std::vector<bool>{true, false, false});
  // Later windows, long or short, change nothing.
  for (double forward : {100e-3, 0.1e-3, 2.5e-3}) {
    const auto later = plan.choose(shape, window(forward));
    CHECK(later.moves == decided.moves);
    CHECK_FALSE(later.decided_now);
  }
  // Other bytes (new input sizes) are another shape, with a warm-up of its own.
  CHECK_FALSE(plan.choose({200, 400, 600}, window(20e-3)).moves);
  CHECK(plan.choose(shape, window(20e-3)).moves == decided.moves);
  // Nothing saved to copy: nothing to decide, nothing to warm up.
  const auto empty = plan.choose({}, window(1e-3));
  REQUIRE(empty.moves);
  CHECK(empty.moves->empty());
  // Up to kMaxShapes shapes: the least recently used is forgotten and warms up again.
  for (int64_t i = 0; i < NeverStallPlan::kMaxShapes; ++i) plan.choose({i + 1}, window(20e-3));
  CHECK_FALSE(plan.choose(shape, window(20e-3)).moves);
  // warmup 1: the first call decides from its own window.
  NeverStallPlan at_once(1);
  const auto first = at_once.choose(shape, window(2.5e-3));
  REQUIRE(first.moves);
  CHECK(*first.moves == std::vector<bool>{true, true, false});
  CHECK_THROWS_AS(NeverStallPlan(0), std::invalid_argument);
}

TEST_CASE(
    "apply_offload never-stall: after the warm-up the same bytes every step, however the windows "
    "vary, and only bytes the shortest window hides") {
  // Forward windows that change from step to step, as the host clock's did on the H100: blocks
  // that sleep `long_ms` on even steps and `short_ms` on odd ones. The link costs `copy_ms` a copy
  // (bandwidth unlimited): a block's two activations fit 2 * copy_ms.
  struct Case {
    const char* what;
    int long_ms, short_ms;
    double copy_ms;
  };
  const Case cases[] = {
      // 20 ms fits both copies, 5 ms one: deciding per call moved 2, 1, 2, 1, ...
      {"long and short windows", 20, 5, 4},
      // 20 ms fits both, 2 ms none: bytes no short window hides must never move.
      {"no short window hides a copy", 20, 2, 8},
  };
  constexpr int kSteps = 8;
  constexpr int kWarmup = 4;  // OffloadOptions::warmup_calls' default
  CHECK(recompose::OffloadOptions().warmup_calls() == kWarmup);
  for (const auto& c : cases) {
    CAPTURE(c.what);
    const auto link = recompose::LinkModel::symmetric(1e15, c.copy_ms * 1e-3);
    Stack s(3);
    auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
    const auto expected = plain_grads(s, x);
    auto manager = test_manager();
    for (auto& b : s.blocks) {
      recompose::apply_offload(
          b, recompose::OffloadOptions().manager(manager).keep_last_on_device(false).never_stall(
                 link));
    }
    std::vector<std::vector<recompose::OffloadStats>> steps(s.blocks.size());
    for (int step = 0; step < kSteps; ++step) {
      for (auto& b : s.blocks) {
        b->sleep_ms = step % 2 == 0 ? c.long_ms : c.short_ms;
        recompose::reset_offload_stats(*b);
      }
      CHECK(rt::bitwise_equal(plain_grads(s, x), expected));
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        steps[i].push_back(recompose::offload_stats(*s.blocks[i]));
      }
    }
    CHECK(manager->tensors_alive() == 0);
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      CAPTURE(i);
      double shortest = std::numeric_limits<double>::infinity();
      for (int step = 0; step < kWarmup; ++step) {
        shortest = std::min(shortest, steps[i][step].window_seconds);
        CHECK(steps[i][step].warmup_calls == (step + 1 < kWarmup ? 1 : 0));
        CHECK(steps[i][step].decisions == (step + 1 == kWarmup ? 1 : 0));
      }
      const auto& decided = steps[i][kWarmup - 1];
      MESSAGE(std::string(c.what) << ", block " << i << ": shortest window " << shortest * 1e3
                                  << " ms, moves " << decided.tensors_offloaded << " of 2");
      // What it moves fits the shortest window measured (window_seconds is counted in whole
      // nanoseconds: 1 ns of slack); one more copy would not.
      CHECK(link.d2h_seconds(decided.bytes_offloaded, decided.tensors_offloaded) <=
            shortest + 1e-9);
      if (decided.tensors_offloaded < 2) {
        CHECK(link.d2h_seconds(decided.bytes_offloaded + kActivationBytes,
                               decided.tensors_offloaded + 1) > shortest - 1e-9);
      }
      // From the decision on: the same bytes every step, long window or short.
      for (int step = kWarmup - 1; step < kSteps; ++step) {
        CAPTURE(step);
        const auto& st = steps[i][step];
        CHECK(st.calls == 1);
        CHECK(st.tensors_offloaded == decided.tensors_offloaded);
        CHECK(st.bytes_offloaded == decided.bytes_offloaded);
        CHECK(st.tensors_over_window == 2 - decided.tensors_offloaded);
        CHECK(st.bytes_over_window == (2 - decided.tensors_offloaded) * kActivationBytes);
        CHECK(st.warmup_calls == 0);
        CHECK(st.bytes_landed == st.bytes_offloaded);
      }
    }
    // The report says how many calls warmed up and how many decisions were made.
    for (auto& b : s.blocks) recompose::reset_offload_stats(*b);
    plain_grads(s, x);
    CHECK(recompose::offload_report(*s.blocks[0]).find("never-stall: 0 of 1 calls") !=
          std::string::npos);
  }
}

TEST_CASE(
    "apply_offload never-stall: new input sizes warm up and decide again; a shape seen before "
    "keeps its decision; gradients bitwise throughout") {
  // A 1 ms forward window and 1.5 MB/s: batch 8's two 512-byte activations fit (0.68 ms), batch
  // 16's two 1 KiB ones do not (1.37 ms), one does (0.68 ms).
  Stack s(3);
  auto x8 = torch::randn({kBatch, kWidth}, torch::requires_grad());
  auto x16 = torch::randn({2 * kBatch, kWidth}, torch::requires_grad());
  const auto expected8 = plain_grads(s, x8);
  const auto expected16 = plain_grads(s, x16);
  auto manager = test_manager();
  for (auto& b : s.blocks) {
    recompose::apply_offload(b, recompose::OffloadOptions()
                                    .manager(manager)
                                    .keep_last_on_device(false)
                                    .never_stall(recompose::LinkModel::symmetric(1.5e6))
                                    .forward_window_seconds(1e-3));
  }
  struct Phase {
    const char* what;
    torch::Tensor x;
    const std::vector<torch::Tensor>& expected;
    int steps;
    int64_t warmup_calls, decisions, offloaded, over_window, activation_bytes;
  };
  const Phase phases[] = {
      {"batch 8", x8, expected8, 5, 3, 1, 2 * 5, 0, kActivationBytes},
      {"batch 16: a new shape", x16, expected16, 5, 3, 1, 1 * 5, 1 * 5, 2 * kActivationBytes},
      {"batch 8 again: decided already", x8, expected8, 2, 0, 0, 2 * 2, 0, kActivationBytes},
  };
  for (const auto& phase : phases) {
    CAPTURE(phase.what);
    for (auto& b : s.blocks) recompose::reset_offload_stats(*b);
    for (int step = 0; step < phase.steps; ++step) {
      CHECK(rt::bitwise_equal(plain_grads(s, phase.x), phase.expected));
    }
    for (auto& b : s.blocks) {
      const auto st = recompose::offload_stats(*b);
      CHECK(st.calls == phase.steps);
      CHECK(st.warmup_calls == phase.warmup_calls);
      CHECK(st.decisions == phase.decisions);
      CHECK(st.tensors_offloaded == phase.offloaded);
      CHECK(st.bytes_offloaded == phase.offloaded * phase.activation_bytes);
      CHECK(st.tensors_over_window == phase.over_window);
    }
    CHECK(manager->tensors_alive() == 0);
  }
  CHECK_THROWS_AS(
      recompose::apply_offload(s.blocks[0], recompose::OffloadOptions().warmup_calls(0)),
      std::invalid_argument);
}

TEST_CASE(
    "apply_offload never-stall: correct and bitwise when backward does not run in reverse forward "
    "order") {
  // Two branches: a = C(A(xa)) and b = B(xb), called A, B, C; backward runs a's branch first (C,
  // then A: B's group sits between them in forward order and is prefetched for nothing), then
  // b's. Every mode, every window: the same gradients as without offload.
  for (bool never_stall : {false, true}) {
    for (int64_t prefetch : {1, 2}) {
      CAPTURE(never_stall);
      CAPTURE(prefetch);
      Stack s(3);  // blocks[0] = A, blocks[1] = B, blocks[2] = C
      auto xa = torch::randn({kBatch, kWidth}, torch::requires_grad());
      auto xb = torch::randn({kBatch, kWidth}, torch::requires_grad());
      auto leaves = with(with(s.params(), xa), xb);
      auto run = [&] {
        auto a = s.blocks[0](xa * 1);
        auto b = s.blocks[1](xb * 1);
        auto la = s.blocks[2](a).pow(2).sum();
        auto lb = b.pow(2).sum();
        for (auto& t : leaves) t.mutable_grad() = torch::Tensor();
        la.backward();
        lb.backward();
        std::vector<torch::Tensor> out;
        for (auto& t : leaves) out.push_back(t.grad().clone());
        return out;
      };
      const auto expected = run();
      auto manager = test_manager(prefetch);
      auto options = recompose::OffloadOptions().manager(manager).keep_last_on_device(false);
      if (never_stall)
        options.never_stall(recompose::LinkModel::symmetric(1e15)).forward_window_seconds(1);
      for (auto& b : s.blocks) recompose::apply_offload(b, options);
      for (int step = 0; step < 2; ++step) CHECK(rt::bitwise_equal(run(), expected));
      const auto st = manager->stats();
      CHECK(st.tensors_offloaded == 2 * 6);
      CHECK(st.tensors_reloaded == st.tensors_offloaded);
      CHECK(manager->tensors_alive() == 0);
    }
  }
}

TEST_SUITE_END();
