// The planner's copy-window cost model and peak device-memory budget (issue 27), on a simulated
// device: op times and link bandwidths are given, nothing is timed.
#include "planner/copy_window_model.h"
#include "support/grad_check.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

using recompose::Budget;
using recompose::LinkModel;
using recompose::ModuleChoice;
using recompose::Plan;
using recompose::detail::CopyWindowModel;
using recompose::detail::ModuleLoad;
using recompose::detail::StepCompute;

namespace {

constexpr double ms = 1e-3;
constexpr int64_t MB = 1'000'000;

// Three modules of 10 ms forward and 20 ms backward, 2 ms of forward after them and 4 ms of
// backward before them; 1 GB/s out, 0.5 GB/s back, 1 ms per copy.
CopyWindowModel hand_model() {
  StepCompute c;
  c.modules = {{10 * ms, 20 * ms}, {10 * ms, 20 * ms}, {10 * ms, 20 * ms}};
  c.forward_tail_seconds = 2 * ms;
  c.backward_head_seconds = 4 * ms;
  return CopyWindowModel(c, LinkModel{1e9, 0.5e9, 1 * ms});
}

// A simulated device: `n` blocks of four ops (2 MB of outputs, 2.5 ms each: 10 ms forward),
// 1 MB of input, 1 ms of replay; a step of `step_ms` (4 blocks: 120 ms is every backward at
// 20 ms and nothing around the blocks); 2 MB held outside the blocks; `resident` bytes beside.
recompose::MemoryProfile simulated_profile(int n = 4, double step_ms = 120,
                                           int64_t resident = 100 * MB) {
  recompose::MemoryProfile p;
  p.device = "cuda:0";
  p.other_bytes = 2 * MB;
  p.step_seconds = step_ms * ms;
  p.resident_bytes = resident;
  for (int i = 0; i < n; ++i) {
    recompose::ModuleProfile m;
    m.name = "blocks." + std::to_string(i);
    m.type = "Block";
    m.calls = 1;
    m.input_bytes = 1 * MB;
    m.saved_bytes = 8 * MB;
    m.forward_seconds = m.selective_forward_seconds = 10 * ms;
    m.replay_seconds = 1 * ms;
    for (int k = 0; k < 4; ++k) {
      m.ops.push_back({"aten::mm.default", k, 2 * MB, 2.5 * ms, false, false, false, false});
    }
    p.modules.push_back(m);
  }
  p.bytes_held = p.other_bytes + n * 8 * MB;
  return p;
}

const LinkModel kLink = LinkModel::symmetric(1e9);
// No allocator headroom: these cases check the simulated peak against the budget itself (the
// headroom has its own cases below).
recompose::SolveOptions with_link(const LinkModel& link = kLink) {
  return recompose::SolveOptions()
      .offload(recompose::OffloadMode::Always)
      .link(link)
      .allocator_headroom(0);
}

}  // namespace

TEST_SUITE_BEGIN("copy_window");

TEST_CASE(
    "copy windows: each copy's window is the compute after it (forward) and before its use "
    "(backward)") {
  const auto model = hand_model();
  CHECK(model.forward_window(0) == doctest::Approx(10 * ms));
  CHECK(model.forward_window(2) ==
        doctest::Approx(2 * ms));  // the last module: the forward after it
  CHECK(model.backward_window(1) == doctest::Approx(20 * ms));
  CHECK(model.backward_window(2) ==
        doctest::Approx(4 * ms));  // the last module: the backward before it
  // 8 MB: 9 ms out (fits 10), 17 ms back (fits 20): free.
  CHECK(model.exposed_seconds(0, 8 * MB, 1) == 0);
  // 12 MB: 13 ms out (3 over), 25 ms back (5 over).
  CHECK(model.exposed_seconds(1, 12 * MB, 1) == doctest::Approx(8 * ms));
  // The fixed cost per copy counts: 8 MB in three copies is 11 ms out, 19 ms back.
  CHECK(model.exposed_seconds(0, 8 * MB, 3) == doctest::Approx(1 * ms));
  // What fits: out (10 - 1) ms x 1 GB/s = 9 MB, back (20 - 1) ms x 0.5 GB/s = 9.5 MB.
  CHECK(model.free_bytes(0, 1) == doctest::Approx(9 * MB).epsilon(1e-9));
  CHECK(model.free_bytes(2, 1) == doctest::Approx(1 * MB).epsilon(1e-9));
  CHECK(model.free_bytes(2, 3) == 0);  // three copies' fixed cost exceeds the 2 ms window
  CHECK_THROWS_AS(CopyWindowModel(StepCompute{}, LinkModel{}), std::invalid_argument);
}

TEST_CASE("copy windows: the simulated step matches a hand-computed time line, waits and peak") {
  const auto model = hand_model();
  // Module 0 offloads 8 MB (fits), module 1 offloads 12 MB (does not fit either way), module 2
  // keeps 2 MB. 1 MB held outside the modules, 1 MB by module 0.
  std::vector<ModuleLoad> loads(3);
  loads[0].held_bytes = 1 * MB, loads[0].offload_bytes = 8 * MB, loads[0].offload_copies = 1;
  loads[1].offload_bytes = 12 * MB, loads[1].offload_copies = 1;
  loads[2].held_bytes = 2 * MB;
  auto s = model.simulate(loads, 1 * MB);
  // Forward: module 1's copy (13 ms) runs from 20 to 33 ms; module 2 offloads nothing, so the
  // swap manager's throttle never stops the compute for it: no wait. Backward starts at 32
  // (+2 tail); head until 36; module 2 36-56. Nothing used a tensor of module 1 before its own
  // backward (module 2 swaps nothing, so nothing prefetches it): its reload runs 56-81 on
  // demand, 25 ms waited; its use prefetches module 0 (81-98), hidden in module 1's backward
  // (81-101); module 0 101-121. (Before, the model started module 1's reload with module 2's
  // backward, 5 ms waited, and made module 2's forward wait 3 ms: neither is what SwapManager
  // does.)
  CHECK(s.compute_seconds == doctest::Approx(96 * ms));
  CHECK(s.seconds == doctest::Approx(121 * ms));
  for (size_t i = 0; i < 3; ++i) CHECK(s.forward_wait_seconds[i] == 0);
  CHECK(s.backward_wait_seconds[1] == doctest::Approx(25 * ms));
  CHECK(s.backward_wait_seconds[0] == 0);
  // The separable estimate gives module 1 module 2's backward as its window (3 + 5 ms): below
  // the simulation, which is why a plan's estimate is the larger of the two.
  double exposed = 0;
  for (size_t i = 0; i < 3; ++i)
    exposed += model.exposed_seconds(i, loads[i].offload_bytes, loads[i].offload_copies);
  CHECK(exposed == doctest::Approx(8 * ms));
  CHECK(exposed < s.seconds - s.compute_seconds);
  // Peak: in forward, module 0's 8 MB land at 19 ms, when module 1 has made 90% of its 12 MB:
  // 1 + 1 + 8 + 10.8 = 20.8 MB. In backward, module 1's backward with its 12 MB and module 0's
  // 8 MB reloaded: 1 + 1 + 8 + 12 = 22 MB.
  CHECK(s.peak_bytes == 22 * MB);
  CHECK(s.peak_in_backward);

  // Module 2 offloads 1 MB too: its first use in backward (on demand: 36-39, 3 ms waited)
  // prefetches module 1 (39-64), which then waits 5 ms at 59; module 0's reload (64-81) hides
  // in module 1's backward (64-84); module 0 84-104: 96 ms of compute and 8 ms of waits.
  auto chained = loads;
  chained[2].offload_bytes = 1 * MB, chained[2].offload_copies = 1;
  s = model.simulate(chained, 1 * MB);
  CHECK(s.seconds == doctest::Approx(104 * ms));
  CHECK(s.backward_wait_seconds[2] == doctest::Approx(3 * ms));
  CHECK(s.backward_wait_seconds[1] == doctest::Approx(5 * ms));
  CHECK(s.backward_wait_seconds[0] == 0);
  for (size_t i = 0; i < 3; ++i) CHECK(s.forward_wait_seconds[i] == 0);
  // The throttle at one group in flight (SwapOptions::max_groups_in_flight(1)): module 1 starts
  // when module 0's copy has landed (19 ms: 9 ms waited), module 2 when module 1's has (42 ms:
  // 13 ms waited); backward waits as above: 104 + 9 + 13 = 126 ms.
  const CopyWindowModel one_in_flight(model.compute(), model.link(), 1);
  s = one_in_flight.simulate(chained, 1 * MB);
  CHECK(s.forward_wait_seconds[0] == doctest::Approx(9 * ms));
  CHECK(s.forward_wait_seconds[1] == doctest::Approx(13 * ms));
  CHECK(s.seconds == doctest::Approx(126 * ms));
  // No throttle: the copies only queue on the stream.
  CHECK(CopyWindowModel(model.compute(), model.link(), 0).simulate(chained, 1 * MB).seconds ==
        doctest::Approx(104 * ms));

  // Module 2 fully checkpointed instead: it recomputes 9 MB and 10 ms in its backward; module
  // 1's reload still starts at its own backward (66-91), and module 2's recomputed tensors are
  // gone by then: the peak stays module 1's 22 MB.
  loads[2].backward_bytes = 9 * MB, loads[2].recompute_seconds = 10 * ms;
  s = model.simulate(loads, 1 * MB);
  CHECK(s.compute_seconds == doctest::Approx(106 * ms));
  CHECK(s.seconds == doctest::Approx(131 * ms));
  CHECK(s.backward_wait_seconds[1] == doctest::Approx(25 * ms));
  CHECK(s.peak_bytes == 22 * MB);

  // Nothing offloaded: no wait, and the peak is everything held when backward starts.
  std::vector<ModuleLoad> plain(3);
  for (auto& l : plain) l.held_bytes = 5 * MB;
  s = model.simulate(plain, 1 * MB);
  CHECK(s.seconds == doctest::Approx(96 * ms));
  CHECK(s.peak_bytes == 16 * MB);
  CHECK_THROWS_AS(model.simulate(std::vector<ModuleLoad>(2), 0), std::invalid_argument);
  CHECK_THROWS_AS(CopyWindowModel(model.compute(), model.link(), -1), std::invalid_argument);
}

TEST_CASE("copy windows: the time line of a profile shares the step's time beyond the forwards") {
  recompose::MemoryProfile p;
  p.modules.resize(2);
  p.modules[0].forward_seconds = 1;
  p.modules[1].forward_seconds = 2;
  p.step_seconds = 10;  // 7 s beyond the forwards: backwards of 2 and 4, 1 s around the modules
  auto c = recompose::detail::step_compute_of(p);
  CHECK(c.modules[0].backward_seconds == doctest::Approx(2));
  CHECK(c.modules[1].backward_seconds == doctest::Approx(4));
  CHECK(c.forward_tail_seconds == doctest::Approx(1.0 / 3));
  CHECK(c.backward_head_seconds == doctest::Approx(2.0 / 3));
  p.step_seconds = 5;  // 2 s beyond: shared in proportion to the forwards, nothing around
  c = recompose::detail::step_compute_of(p);
  CHECK(c.modules[1].backward_seconds == doctest::Approx(4.0 / 3));
  CHECK(c.forward_tail_seconds == 0);
}

TEST_CASE(
    "copy windows: measured backward times are the time line's; twice the forward only without "
    "them") {
  auto p = simulated_profile();  // 4 blocks of 10 ms forward, a 120 ms step
  CHECK(!p.backward_measured());
  CHECK(recompose::detail::step_compute_of(p).modules[1].backward_seconds ==
        doctest::Approx(20 * ms));
  // Measured: block 1's backward is short (1 ms), the others 20 ms; 6 ms of the step around them.
  const double measured[] = {20 * ms, 1 * ms, 20 * ms, 20 * ms};
  for (size_t i = 0; i < 4; ++i) p.modules[i].backward_seconds = measured[i];
  p.step_seconds = 40 * ms + 61 * ms + 6 * ms;
  CHECK(p.backward_measured());
  auto c = recompose::detail::step_compute_of(p);
  for (size_t i = 0; i < 4; ++i)
    CHECK(c.modules[i].backward_seconds == doctest::Approx(measured[i]));
  CHECK(c.forward_tail_seconds == doctest::Approx(2 * ms));
  CHECK(c.backward_head_seconds == doctest::Approx(4 * ms));
  // Block 0's copy back must land within block 1's backward: 1 ms, not the 20 ms the 2x rule gives.
  const CopyWindowModel windows(c, kLink);
  CHECK(windows.backward_window(0) == doctest::Approx(1 * ms));
  CHECK(windows.exposed_seconds(0, 8 * MB, 1) == doctest::Approx(7 * ms));
  // Spans longer than the step leaves beside the forwards are scaled down together.
  p.step_seconds = 40 * ms + 30.5 * ms;
  c = recompose::detail::step_compute_of(p);
  CHECK(c.modules[0].backward_seconds == doctest::Approx(10 * ms));
  CHECK(c.modules[1].backward_seconds == doctest::Approx(0.5 * ms));
  CHECK(c.backward_head_seconds == doctest::Approx(0));
  // One module not measured (0): the 2x rule for all.
  p.step_seconds = 120 * ms;
  p.modules[2].backward_seconds = 0;
  CHECK(!p.backward_measured());
  CHECK(recompose::detail::step_compute_of(p).modules[1].backward_seconds ==
        doctest::Approx(20 * ms));
}

TEST_CASE(
    "copy windows: a short measured backward exposes the copy back the 2x rule would hide; the "
    "plan says which it used") {
  auto assumed = simulated_profile();
  // Block 1 is of another type (twins share their estimates), with a 1 ms backward; the others'
  // backward is 20 ms, as the 2x rule assumes, and nothing of the step is around the blocks.
  assumed.modules[1].type = "Other";
  assumed.step_seconds = 40 * ms + 61 * ms;
  auto measured = assumed;
  for (size_t i = 0; i < 4; ++i) measured.modules[i].backward_seconds = i == 1 ? 1 * ms : 20 * ms;
  const int64_t budget = assumed.other_bytes + 8 * MB + 1 * MB;
  const Plan a = recompose::solve_plan(assumed, Budget::bytes(budget), with_link());
  const Plan m = recompose::solve_plan(measured, Budget::bytes(budget), with_link());
  CHECK(!a.backward_measured);
  CHECK(m.backward_measured);
  CHECK(a.to_table().find("assumed twice its forward") != std::string::npos);
  CHECK(m.to_table().find("backward as profiled") != std::string::npos);
  // Under the 2x rule block 0 offloads for free (1 ms of replay at most); measured, its copy back
  // has 1 ms of window for 8 ms of copy: what it costs now shows in its estimate and the step's.
  CHECK(a.modules[0].seconds <= 1 * ms + 1e-6);
  CHECK(m.modules[0].seconds > 1 * ms);
  CHECK(m.step_seconds > a.step_seconds);
  // The simulation of each plan on its own time line agrees with its estimate (or is faster).
  CHECK(recompose::detail::simulate_plan(measured, m, kLink).seconds <= m.step_seconds + 1e-6);
  CHECK(recompose::detail::simulate_plan(assumed, a, kLink).seconds <= a.step_seconds + 1e-6);
}

TEST_CASE(
    "copy windows: the planner offloads where the copies hide and recomputes where they would "
    "not") {
  const auto p = simulated_profile();
  // Room for every block but one offloaded (the base counts one block's 8 MB in flight) and one
  // block's inputs.
  const int64_t budget = p.other_bytes + 8 * MB + 1 * MB;
  const Plan plan = recompose::solve_plan(p, Budget::bytes(budget), with_link());
  // Blocks 0-2: 8 ms each way against a 10 ms forward and a 20 ms backward window: free. Block 3
  // has no compute after it in forward: its copies would all be exposed (16 ms > its 10 ms
  // recomputation), so it is recomputed.
  // Offloading goes whole (apply_offload) or op by op (selective with every op swapped, for its
  // 1 ms of replay but no block in flight at the end of its call): either way nothing of blocks
  // 0-2 is recomputed. Block 3 swaps no op; it is fully checkpointed with its 1 MB input in host
  // memory (2 ms exposed in forward): the first use of that input in backward prefetches block
  // 2's copies. Recomputing block 3 without a copy (the plan before the swap manager's prefetch
  // was modelled) leaves block 2's reload to start on demand at its own backward, 8 ms waited.
  REQUIRE(plan.modules.size() == 4);
  auto offloaded = [](const recompose::ModulePlan& m) {
    return m.choice == ModuleChoice::Offload ||
           (m.choice == ModuleChoice::Selective && m.swap.size() == 4);
  };
  for (size_t i = 0; i < 3; ++i) CHECK(offloaded(plan.modules[i]));
  for (size_t i = 0; i < 3; ++i) CHECK(plan.modules[i].seconds <= 1 * ms + 1e-6);
  CHECK(plan.modules[3].swap.empty());
  CHECK(plan.modules[3].choice == ModuleChoice::FullSwapInputs);
  CHECK(plan.modules[3].seconds == doctest::Approx(12 * ms).epsilon(1e-4));
  // The simulation agrees: no wait, one recomputation.
  const auto s = recompose::detail::simulate_plan(p, plan, kLink);
  CHECK(s.seconds == doctest::Approx(plan.step_seconds));

  // A link too slow for a whole block (0.5 GB/s: 16 ms out against a 10 ms window): no block is
  // offloaded whole; at most the three ops whose copies cost less than recomputing them are
  // swapped (two fit, the third exposes 2 ms against its 2.5 ms), the rest is recomputed or kept.
  const Plan slow =
      recompose::solve_plan(p, Budget::bytes(budget), with_link(LinkModel::symmetric(0.5e9)));
  for (const auto& m : slow.modules) {
    CHECK(m.choice != ModuleChoice::Offload);
    CHECK(m.swap.size() <= 3);
  }

  // With a window that takes part of a block (6 ms around the blocks: a 2 ms forward after the
  // last one, 4 ms of backward before it), the last block swaps what its copies hide or cost less
  // than recomputing (2 MB free, 2 MB for 2 ms against 2.5 ms) and recomputes the rest:
  // selective with swapped ops, 8 ms against full's 10 ms and whole offload's 10 ms exposed.
  const auto tail = simulated_profile(4, 126);
  const Plan partial = recompose::solve_plan(tail, Budget::bytes(budget), with_link());
  const auto& last = partial.modules[3];
  CHECK(last.choice == ModuleChoice::Selective);
  CHECK(last.swap.size() == 2);
  // 1 ms replay + 2 ms exposed copy + 2.5 ms per op neither kept nor swapped.
  CHECK(last.seconds ==
        doctest::Approx(3 * ms + 2.5 * ms * static_cast<double>(2 - last.save.size())));
}

TEST_CASE(
    "peak budget: Budget::peak_bytes and \"peak=20GiB\" budget the whole step's device memory") {
  const Budget b = Budget::parse("peak=20GiB");
  CHECK(b.is_peak());
  CHECK(!b.is_fraction());
  auto p = simulated_profile();
  p.resident_bytes = 15 * (int64_t{1} << 30);
  CHECK(b.resolve(p) == 5 * (int64_t{1} << 30));  // what is left for activations
  CHECK(Budget::peak_bytes(123).resolve(p) == 123 - p.resident_bytes);
  CHECK_THROWS_AS(Budget::parse("peak=40%"), std::invalid_argument);
  CHECK_THROWS_AS(Budget::parse("peak="), std::invalid_argument);
  CHECK_THROWS_AS(Budget::peak_bytes(0), std::invalid_argument);
  // Below the resident bytes, or below the least simulated peak: a clear error.
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::parse("peak=10GiB"), with_link()),
                       doctest::Contains("resident"), std::invalid_argument);
  // Profiles and plans keep the new figures through JSON.
  CHECK(recompose::MemoryProfile::from_json(p.to_json()).resident_bytes == p.resident_bytes);
  const Plan plan = recompose::solve_plan(p, Budget::parse("peak=20GiB"), with_link());
  CHECK(plan.peak_bytes > p.resident_bytes);
  CHECK(Plan::from_json(plan.to_json()) == plan);
}

TEST_CASE("peak budget: min_plan_peak_bytes is the least peak solve_plan accepts") {
  const auto p = simulated_profile();
  const int64_t least = recompose::min_plan_peak_bytes(p, with_link());
  CHECK(least > p.resident_bytes);
  CHECK(least < p.resident_bytes + p.bytes_held);
  const Plan at_least = recompose::solve_plan(p, Budget::peak_bytes(least), with_link());
  CHECK(at_least.peak_bytes == least);
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::peak_bytes(least - 1), with_link()),
                       doctest::Contains("min_plan_peak_bytes"), std::invalid_argument);
  // And it says where that least peak sits: the recomputation of a block in backward (every
  // block holds its input, 1 MB, and rebuilds its 8 MB).
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::peak_bytes(least - 1), with_link()),
                       doctest::Contains("peak falls in the backward of module 'blocks."),
                       std::invalid_argument);
  // No budget of a fine sweep below it finds a plan; every one from it up does.
  for (int64_t peak = p.resident_bytes; peak <= least + 4 * MB; peak += MB / 8) {
    CAPTURE(peak);
    bool solved = true;
    try {
      (void)recompose::solve_plan(p, Budget::peak_bytes(peak), with_link());
    } catch (const std::invalid_argument&) {
      solved = false;
    }
    CHECK(solved == (peak >= least));
  }
}

TEST_CASE("peak budget: below the least peak, the refusal names the module that sets it") {
  // Planted: blocks.2 saves five times what the others do, so rebuilding it in backward is the
  // highest point of every plan; a peak budget just below the least is refused, naming it.
  auto p = simulated_profile();
  auto& big = p.modules[2];
  for (auto& op : big.ops) op.output_bytes *= 5;
  big.saved_bytes *= 5;
  p.bytes_held += 4 * 8 * MB;
  const int64_t least = recompose::min_plan_peak_bytes(p, with_link());
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::peak_bytes(least - 1), with_link()),
                       doctest::Contains("peak falls in the backward of module 'blocks.2' (Block)"),
                       std::invalid_argument);
  // The same profile with the big block moved to blocks.0: the message follows it.
  std::swap(p.modules[0].ops, p.modules[2].ops);
  std::swap(p.modules[0].saved_bytes, p.modules[2].saved_bytes);
  const int64_t least0 = recompose::min_plan_peak_bytes(p, with_link());
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::peak_bytes(least0 - 1), with_link()),
                       doctest::Contains("peak falls in the backward of module 'blocks.0' (Block)"),
                       std::invalid_argument);
}

TEST_CASE("peak budget: the simulated peak stays at or under every budget of a sweep") {
  const auto p = simulated_profile();
  const int64_t none_peak = p.resident_bytes + p.bytes_held;
  int64_t last_bytes = 0;
  double last_seconds = INFINITY;
  int fitted = 0, beyond_bytes_budget = 0;
  for (int64_t peak = p.resident_bytes; peak <= none_peak + 4 * MB; peak += MB / 4) {
    CAPTURE(peak);
    Plan plan;
    try {
      plan = recompose::solve_plan(p, Budget::peak_bytes(peak), with_link());
    } catch (const std::invalid_argument&) {
      CHECK(fitted == 0);  // only budgets below every plan fail
      continue;
    }
    ++fitted;
    CHECK(plan.peak_bytes <= peak);
    CHECK(p.resident_bytes + recompose::detail::simulate_plan(p, plan, kLink).peak_bytes ==
          plan.peak_bytes);
    CHECK(plan.bytes >= last_bytes);
    CHECK(plan.step_seconds <= last_seconds);
    last_bytes = plan.bytes, last_seconds = plan.step_seconds;
    // The same number as a budget of bytes held for backward ignores what backward holds on top
    // (recomputed tensors, reloads): its plan may overshoot the peak.
    const Plan by_bytes =
        recompose::solve_plan(p, Budget::bytes(peak - p.resident_bytes), with_link());
    if (by_bytes.peak_bytes > peak) ++beyond_bytes_budget;
  }
  CHECK(fitted > 50);
  CHECK(beyond_bytes_budget > 0);
  // At the top: no checkpointing, its peak is what it holds when backward starts.
  const Plan top = recompose::solve_plan(p, Budget::peak_bytes(none_peak), with_link());
  for (const auto& m : top.modules) CHECK(m.choice == ModuleChoice::None);
  CHECK(top.peak_bytes == none_peak);
}

namespace {

// A small CPU model for applying plans: blocks of a layer norm, an MLP and a residual.
struct WBlockImpl : torch::nn::Module {
  explicit WBlockImpl(int64_t w) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
    up = register_module("up", torch::nn::Linear(w, 2 * w));
    down = register_module("down", torch::nn::Linear(2 * w, w));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return x + down(torch::relu(up(norm(x))).sigmoid() * x.repeat({1, 2}));
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(WBlock);

struct WNetImpl : torch::nn::Module {
  explicit WNetImpl(int n) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < n; ++i) {
      blocks.emplace_back(24);
      list->push_back(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x.tanh().pow(2).mean();
  }
  std::vector<WBlock> blocks;
};
TORCH_MODULE(WNet);

WNet make_wnet() {
  torch::manual_seed(3);
  return WNet(4);
}

torch::Tensor winput() {
  torch::manual_seed(11);
  return torch::randn({32, 24});
}

std::vector<torch::Tensor> wgrads(const Plan* plan) {
  WNet net = make_wnet();
  if (plan) recompose::apply_plan(*net, *plan);
  auto x = winput();
  auto grads = rt::grads_of([&] { return net(x); }, net->parameters());
  grads.push_back(net(x).detach());
  return grads;
}

}  // namespace

TEST_CASE(
    "peak budget: every plan of a sweep, applied on CPU, gives gradients bitwise equal to no "
    "checkpointing") {
  WNet net = make_wnet();
  auto x = winput();
  auto p = recompose::profile_memory(*net, [&] { net(x).backward(); });
  // A simulated device: the measured bytes, given times (each op 1 ms, forward the sum, backward
  // twice that) and resident bytes, so that the plans do not depend on this machine's timing.
  p.resident_bytes = 1 << 20;
  double forwards = 0;
  for (auto& m : p.modules) {
    for (auto& o : m.ops) o.seconds = 1 * ms;
    m.forward_seconds = m.selective_forward_seconds = static_cast<double>(m.ops.size()) * ms;
    m.replay_seconds = 0.2 * ms;
    forwards += m.forward_seconds;
  }
  p.step_seconds = 3 * forwards + 2 * ms;
  const auto plain = wgrads(nullptr);
  // A link that moves a block's saved bytes in about a third of a block's forward.
  const LinkModel link = LinkModel::symmetric(static_cast<double>(p.modules[0].saved_bytes) /
                                              (p.modules[0].forward_seconds / 3));
  std::set<ModuleChoice> seen;
  int swapped_ops = 0;
  const int64_t top = p.resident_bytes + p.bytes_held;
  for (int i = 0; i <= 24; ++i) {
    const int64_t peak = p.resident_bytes + (top - p.resident_bytes) * i / 24;
    CAPTURE(peak);
    Plan plan;
    try {
      plan = recompose::solve_plan(p, Budget::peak_bytes(peak), with_link(link));
    } catch (const std::invalid_argument&) {
      continue;
    }
    CHECK(plan.peak_bytes <= peak);
    for (const auto& m : plan.modules)
      seen.insert(m.choice), swapped_ops += static_cast<int>(m.swap.size());
    CHECK(rt::bitwise_equal(plain, wgrads(&plan)));
  }
  CHECK(seen.count(ModuleChoice::None) == 1);
  CHECK(seen.count(ModuleChoice::Offload) == 1);
  CHECK(seen.size() >= 3);
}

TEST_CASE(
    "copy windows: a swap whose reload nothing prefetches stalls, and the planner picks the "
    "no-swap plan it knows fits") {
  // Two blocks (4 ops of 2 MB and 2.5 ms, 10 ms forward, 20 ms backward, nothing around them).
  // Room for block 1 whole and block 0's input plus one op.
  // A 0.7 GB/s link.
  auto p = simulated_profile(2, 60);
  const int64_t budget = p.other_bytes + 8 * MB + 1 * MB + 2 * MB;
  const LinkModel link = LinkModel::symmetric(0.7e9);
  const Plan plan = recompose::solve_plan(p, Budget::bytes(budget), with_link(link));
  // Before: block 0 kept one op and swapped three (6 MB: 8.6 ms each way, inside block 1's 10 ms
  // forward and 20 ms backward), estimated at its 1 ms of replay. But block 1 swaps nothing, so
  // nothing prefetches block 0: its reload starts when its own backward needs it, 8.6 ms waited.
  recompose::ModulePlan swapping;
  swapping.name = "blocks.0", swapping.type = "Block", swapping.choice = ModuleChoice::Selective;
  swapping.save = {{"aten::mm.default", 0}};
  swapping.swap = {{"aten::mm.default", 1}, {"aten::mm.default", 2}, {"aten::mm.default", 3}};
  Plan old = plan;
  old.modules = {swapping};
  const auto stalled = recompose::detail::simulate_plan(p, old, link);
  CHECK(stalled.backward_wait_seconds[0] == doctest::Approx(6 * MB / 0.7e9));
  CHECK(stalled.seconds == doctest::Approx(60 * ms + 1 * ms + 6 * MB / 0.7e9));
  // Now: no copy at all. One block keeps one op and recomputes three (1 ms of replay + 7.5 ms),
  // the other holds everything: 8.5 ms, against the swaps' 9.6 ms.
  for (const auto& m : plan.modules) CHECK(m.swap.empty());
  for (const auto& m : plan.modules) CHECK(m.choice != ModuleChoice::Offload);
  CHECK(plan.step_seconds == doctest::Approx(60 * ms + 8.5 * ms));
  CHECK(plan.step_seconds < stalled.seconds);
  CHECK(recompose::detail::simulate_plan(p, plan, link).seconds ==
        doctest::Approx(plan.step_seconds));
}

TEST_CASE(
    "copy windows: a plan's estimate is never below its simulated step, and never above a no-swap "
    "plan that fits") {
  // Every bytes budget of a sweep over the 4-block profile with a link that hides whole blocks.
  const auto p = simulated_profile();
  const auto no_copy = recompose::SolveOptions().offload(recompose::OffloadMode::Never);
  for (int64_t b = recompose::min_plan_bytes(p, with_link()); b <= p.bytes_held; b += MB / 2) {
    CAPTURE(b);
    const Plan plan = recompose::solve_plan(p, Budget::bytes(b), with_link());
    CHECK(recompose::detail::simulate_plan(p, plan, kLink).seconds <= plan.step_seconds + 1e-9);
    if (b >= recompose::min_plan_bytes(p, no_copy)) {
      CHECK(plan.step_seconds <=
            recompose::solve_plan(p, Budget::bytes(b), no_copy).step_seconds + 1e-9);
    }
  }
}

TEST_CASE("peak budget: the caching allocator's headroom is left beside the simulated peak") {
  const auto p = simulated_profile();
  const auto options = with_link().allocator_headroom(0.06);
  const int64_t least = recompose::min_plan_peak_bytes(p, options);
  // The least budget leaves 6% of itself beside the least simulated peak.
  CHECK(least > recompose::min_plan_peak_bytes(p, with_link()));
  CHECK(least - static_cast<int64_t>(std::ceil(0.06 * static_cast<double>(least))) >=
        recompose::min_plan_peak_bytes(p, with_link()));
  CHECK_THROWS_WITH_AS(recompose::solve_plan(p, Budget::peak_bytes(least - 1), options),
                       doctest::Contains("allocator_headroom"), std::invalid_argument);
  const int64_t none_peak = p.resident_bytes + p.bytes_held;
  for (int64_t peak = least; peak <= none_peak + 16 * MB; peak += MB / 2) {
    CAPTURE(peak);
    const Plan plan = recompose::solve_plan(p, Budget::peak_bytes(peak), options);
    // The simulated peak, and the largest module's swapped bytes where it swaps, within 94%.
    int64_t pool = 0;
    for (const auto& l : recompose::detail::module_loads(p, plan))
      pool = std::max(pool, l.offload_bytes);
    CHECK(plan.peak_bytes + pool <= peak - static_cast<int64_t>(std::ceil(0.06 * peak)));
  }
  // No checkpointing needs its peak and 6% more: at its peak exactly, something is checkpointed.
  const Plan at_none = recompose::solve_plan(p, Budget::peak_bytes(none_peak), options);
  CHECK(at_none.peak_bytes < none_peak);
  // On CPU there is no caching allocator: no headroom.
  auto cpu = p;
  cpu.device = "cpu";
  CHECK(recompose::min_plan_peak_bytes(cpu, options) ==
        recompose::min_plan_peak_bytes(cpu, with_link()));
  CHECK_THROWS_AS(
      recompose::solve_plan(p, Budget::peak_bytes(none_peak), with_link().allocator_headroom(1.0)),
      std::invalid_argument);
  CHECK_THROWS_AS(
      recompose::solve_plan(p, Budget::peak_bytes(none_peak), with_link().max_groups_in_flight(-1)),
      std::invalid_argument);
}

TEST_SUITE_END();
