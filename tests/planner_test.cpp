// The memory-budget planner: profile, solve, apply, save/load (recompose/planner.h).
#include "planner/copy_window_model.h"
#include "selective/transformer_save_list.h"
#include "support/grad_check.h"
#include "support/selective_helpers.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

using recompose::Budget;
using recompose::ModuleChoice;
using recompose::Plan;

namespace {

using rt::ReplaySwitch;

// A small pre-norm block: attention-like products, an MLP, an in-place op on an intermediate
// read before the write (whose output must never be kept) and a random mask.
struct PBlockImpl : torch::nn::Module {
  explicit PBlockImpl(int64_t w) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
    fc1 = register_module("fc1", torch::nn::Linear(w, 4 * w));
    fc2 = register_module("fc2", torch::nn::Linear(4 * w, w));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto h = ln(x);
    auto att = torch::softmax(torch::matmul(h, h.transpose(-2, -1)) / 4.0, -1);
    h = torch::matmul(att, h);
    auto g = torch::gelu(fc1(h));
    auto skip = g * 0.25;  // reads gelu's output before the write below ...
    g.mul_(0.5);           // ... so keeping gelu's output would need a copy of it: never kept
    auto mask = torch::bernoulli(torch::full_like(x, 0.9));
    return x + fc2(g + skip) * mask;
  }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PBlock);

struct PNetImpl : torch::nn::Module {
  PNetImpl(int64_t layers, int64_t w) {
    list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) {
      blocks.emplace_back(w);
      list->push_back(blocks.back());
    }
    head = register_module("head", torch::nn::Linear(w, w));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return head(torch::tanh(x));
  }
  torch::nn::ModuleList list{nullptr};
  std::vector<PBlock> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(PNet);

constexpr int64_t kLayers = 4, kWidth = 32;

PNet make_net(uint64_t seed = 7) {
  torch::manual_seed(seed);
  return PNet(kLayers, kWidth);
}

torch::Tensor input() {
  torch::manual_seed(99);
  return torch::randn({4, 16, kWidth});
}

torch::Tensor loss_of(PNet& net, const torch::Tensor& x) { return net(x).pow(2).mean(); }

// One profile shared by the cases that only solve (profiling runs the model twice).
const recompose::MemoryProfile& shared_profile() {
  static const recompose::MemoryProfile profile = [] {
    PNet net = make_net();
    auto x = input();
    return recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); });
  }();
  return profile;
}

std::vector<double> budget_grid(const recompose::MemoryProfile& profile, int n) {
  const double lo = static_cast<double>(recompose::min_plan_bytes(profile)) /
                    static_cast<double>(profile.bytes_held);
  std::vector<double> out;
  for (int i = 0; i <= n; ++i) out.push_back(lo + (1.05 - lo) * i / n);
  return out;
}

// Gradients (and loss) of one step under `plan`, from the same seed as a plain model's.
std::vector<torch::Tensor> grads_under(const Plan* plan) {
  PNet net = make_net();
  if (plan) recompose::apply_plan(*net, *plan);
  auto x = input();
  torch::manual_seed(5);  // the masks
  auto grads = rt::grads_of([&] { return loss_of(net, x); }, net->parameters());
  auto loss = loss_of(net, x).detach();
  grads.push_back(loss);
  return grads;
}

}  // namespace

TEST_CASE("on CPU the profile's resident bytes are the model's parameters, gradients and buffers") {
  PNet net = make_net();
  int64_t params = 0, buffers = 0;
  for (const auto& p : net->parameters()) params += p.numel() * p.element_size();
  for (const auto& b : net->buffers()) buffers += b.numel() * b.element_size();
  const auto profile = shared_profile();
  REQUIRE(profile.device == "cpu");
  // Every parameter gets a gradient of its size in the step; no allocator peak off CUDA.
  CHECK(profile.resident_bytes == 2 * params + buffers);
  // A peak budget below it says what it counts.
  CHECK_THROWS_WITH_AS(
      recompose::solve_plan(profile, recompose::Budget::peak_bytes(profile.resident_bytes + 1)),
      doctest::Contains("parameters, gradients and buffers only"), std::invalid_argument);
}

TEST_CASE(
    "planner: the profile names each block, its ops, what it saves and what its inputs hold") {
  const auto& p = shared_profile();
  REQUIRE(p.modules.size() == kLayers);
  CHECK(p.modules[0].name == "blocks.0");
  CHECK(p.modules[3].name == "blocks.3");
  CHECK(p.device == "cpu");
  CHECK(p.copy_bandwidth == 0);
  CHECK(p.step_seconds > 0);
  const int64_t activation = 4 * 16 * kWidth * 4;
  for (const auto& m : p.modules) {
    CHECK(m.calls == 1);
    CHECK(m.input_bytes == activation);
    CHECK(m.saved_bytes > m.input_bytes);
    CHECK(m.forward_seconds > 0);
    CHECK(m.replay_seconds > 0);
    REQUIRE(!m.ops.empty());
    std::set<std::string> names;
    bool mutated_gelu = false, random = false;
    for (const auto& o : m.ops) {
      names.insert(o.op);
      CHECK(!o.inplace);
      CHECK(!o.view);
      if (o.op == "aten::gelu.default") mutated_gelu = o.mutated && !o.carries_write;
      random = random || o.random;
      CHECK(o.output_bytes >= 0);
    }
    // Each op's time is a span inside its module's intercepted forward; spans do not overlap.
    double op_seconds = 0;
    for (const auto& o : m.ops) op_seconds += o.seconds;
    CHECK(op_seconds <= m.selective_forward_seconds);
    CHECK(m.forward_seconds < p.step_seconds);
    CHECK(names.count("aten::addmm.default") + names.count("aten::mm.default") > 0);
    CHECK(names.count("aten::bmm.default") > 0);
    CHECK(mutated_gelu);
    CHECK(random);
  }
  CHECK(p.bytes_held >= p.other_bytes);
  CHECK(p.to_string().find("blocks.2") != std::string::npos);
}

TEST_CASE(
    "planner: a larger budget never holds fewer bytes nor takes more time; no plan exceeds its "
    "budget") {
  for (auto offload : {recompose::OffloadMode::Never, recompose::OffloadMode::Always}) {
    const auto options = recompose::SolveOptions().offload(offload).copy_bandwidth(2e9);
    const auto& p = shared_profile();
    int64_t last_bytes = 0;
    double last_seconds = INFINITY;
    const double lo = static_cast<double>(recompose::min_plan_bytes(p, options)) /
                      static_cast<double>(p.bytes_held);
    for (int i = 0; i <= 200; ++i) {
      const double f = lo + (1.1 - lo) * i / 200.0;
      const Plan plan = recompose::solve_plan(p, Budget::fraction(f), options);
      CHECK(plan.bytes <= plan.budget_bytes);
      CHECK(plan.bytes >= last_bytes);
      CHECK(plan.step_seconds <= last_seconds);
      last_bytes = plan.bytes;
      last_seconds = plan.step_seconds;
    }
    // At the top no module is checkpointed; at the bottom, with offload off, every one is.
    const Plan top = recompose::solve_plan(p, Budget::fraction(1.0), options);
    for (const auto& m : top.modules) CHECK(m.choice == ModuleChoice::None);
    CHECK(top.step_seconds == doctest::Approx(p.step_seconds));
  }
  const Plan bottom = recompose::solve_plan(
      shared_profile(), Budget::bytes(recompose::min_plan_bytes(shared_profile())));
  for (const auto& m : bottom.modules) CHECK(m.choice == ModuleChoice::Full);
}

TEST_CASE(
    "planner: a plan never keeps an op whose output the forward reads, then writes in place") {
  for (double f : budget_grid(shared_profile(), 20)) {
    const Plan plan = recompose::solve_plan(shared_profile(), Budget::fraction(f));
    for (const auto& m : plan.modules) {
      for (const auto& o : m.save) CHECK(o.op != "aten::gelu.default");
    }
  }
}

TEST_CASE("planner: applied plans hold at most the budget (+5%) and give bitwise-equal gradients") {
  const auto& p = shared_profile();
  const auto plain = grads_under(nullptr);
  std::set<ModuleChoice> seen;
  for (double f : budget_grid(p, 8)) {
    CAPTURE(f);
    const Plan plan = recompose::solve_plan(p, Budget::fraction(f));
    for (const auto& m : plan.modules) seen.insert(m.choice);
    CHECK(rt::bitwise_equal(plain, grads_under(&plan)));

    PNet net = make_net();
    recompose::apply_plan(*net, plan);
    auto x = input();
    recompose::SavedTensorMeter meter;
    auto loss = loss_of(net, x);
    const int64_t held = meter.peak_bytes_held();
    loss.backward();
    CHECK(static_cast<double>(held) <= 1.05 * static_cast<double>(plan.budget_bytes));
  }
  CHECK(seen.count(ModuleChoice::None) == 1);
  CHECK(seen.count(ModuleChoice::Full) == 1);
  // Whether the solver picks a selective configuration depends on measured times; a hand-made
  // one (every second op kept in two blocks) checks that path whatever the machine.
  Plan selective = recompose::solve_plan(p, Budget::fraction(0.5));
  for (size_t i : {0, 2}) {
    selective.modules[i].choice = ModuleChoice::Selective;
    selective.modules[i].save.clear();
    for (size_t k = 0; k < p.modules[i].ops.size(); k += 2) {
      if (!p.modules[i].ops[k].mutated)
        selective.modules[i].save.push_back(
            {p.modules[i].ops[k].op, p.modules[i].ops[k].call_index});
    }
    REQUIRE(!selective.modules[i].save.empty());
  }
  CHECK(rt::bitwise_equal(plain, grads_under(&selective)));
}

TEST_CASE("planner: plan_memory profiles and solves in one call; remove_plan takes the plan off") {
  PNet net = make_net();
  auto x = input();
  const Plan plan = recompose::plan_memory(
      *net, [&] { loss_of(net, x).backward(); }, Budget::parse("50%"));
  CHECK(plan.bytes <= plan.budget_bytes);
  CHECK(plan.solve_seconds >= 0);
  recompose::apply_plan(*net, plan);
  int64_t applied = 0;
  for (auto& b : net->blocks) applied += recompose::is_checkpointed(b) ? 1 : 0;
  CHECK(applied > 0);
  CHECK_THROWS_AS(recompose::apply_plan(*net, plan),
                  recompose::CheckpointError);  // already applied
  CHECK_THROWS_AS(recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); }),
                  recompose::CheckpointError);
  CHECK(recompose::remove_plan(*net, plan) == applied);
  for (auto& b : net->blocks) CHECK(!recompose::is_checkpointed(b));
  CHECK(plan.to_table().find("blocks.0") != std::string::npos);
}

TEST_CASE(
    "planner: remove_plan takes off what apply_plan attached, not what the user attached "
    "afterwards") {
  PNet net = make_net();
  auto x = input();
  const recompose::MemoryProfile profile =
      recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); });
  const Plan keep_all = recompose::solve_plan(profile, Budget::fraction(1.0));  // every block None
  recompose::apply_plan(*net, keep_all);
  recompose::apply_checkpoint(net->blocks[0]);  // the user's own, after the plan
  CHECK(recompose::remove_plan(*net, keep_all) == 0);
  CHECK(recompose::is_checkpointed(net->blocks[0]));
  recompose::remove_checkpoint(net->blocks[0]);
  // A plan's own choices come off, and the plan can be applied again.
  const Plan half = recompose::solve_plan(profile, Budget::fraction(0.5));
  int64_t chosen = 0;
  for (const auto& m : half.modules) chosen += m.choice != ModuleChoice::None ? 1 : 0;
  REQUIRE(chosen > 0);
  auto marked = [&] {
    int64_t n = 0;
    for (auto& b : net->blocks) {
      const auto apis = recompose::hooks::applied_apis(*b);
      n += std::find(apis.begin(), apis.end(), "recompose.plan") != apis.end() ? 1 : 0;
    }
    return n;
  };
  recompose::apply_plan(*net, half);
  CHECK(marked() == chosen);
  CHECK(recompose::remove_plan(*net, half) == chosen);
  CHECK(marked() == 0);
  recompose::apply_plan(*net, half);
  CHECK(recompose::remove_plan(*net, half) == chosen);
}

TEST_CASE("planner: plans and profiles survive JSON, in memory and in files") {
  const auto& p = shared_profile();
  const Plan plan = recompose::solve_plan(p, Budget::fraction(0.5));
  CHECK(Plan::from_json(plan.to_json()) == plan);
  const auto q = recompose::MemoryProfile::from_json(p.to_json());
  CHECK(q.to_json() == p.to_json());
  Plan again = recompose::solve_plan(q, Budget::fraction(0.5));
  again.solve_seconds = plan.solve_seconds;
  CHECK(again == plan);

  const auto dir = std::filesystem::temp_directory_path() / "recompose_planner_test";
  std::filesystem::create_directories(dir);
  plan.save(dir / "plan.json");
  p.save(dir / "profile.json");
  CHECK(Plan::load(dir / "plan.json") == plan);
  CHECK(recompose::MemoryProfile::load(dir / "profile.json").to_json() == p.to_json());
  std::filesystem::remove_all(dir);
  CHECK_THROWS_AS(Plan::load(dir / "missing.json"), recompose::CheckpointError);
  CHECK_THROWS_AS(Plan::from_json("{\"format\": \"recompose.plan\", \"version\": 1"),
                  std::invalid_argument);
  CHECK_THROWS_AS(Plan::from_json(p.to_json()), std::invalid_argument);  // a profile is no plan
  CHECK_THROWS_AS(Plan::from_json("[1, 2]"), std::invalid_argument);
}

TEST_CASE("planner: bad budgets and misuse are clear errors") {
  for (const char* text : {"", "abc", "-5%", "0", "0%", "12XB", "1.5", "nan%", "inf"}) {
    CAPTURE(text);
    CHECK_THROWS_AS(Budget::parse(text), std::invalid_argument);
  }
  CHECK(Budget::parse("40%").is_fraction());
  CHECK(Budget::parse("2MiB").resolve(shared_profile()) == 2 * 1024 * 1024);
  CHECK(Budget::parse("64MB").resolve(shared_profile()) == 64'000'000);
  CHECK(Budget::parse("123456").resolve(shared_profile()) == 123456);
  // A bare number up to 100 is a percentage that lost its '%': an error saying so.
  CHECK_THROWS_WITH_AS(Budget::parse("50"), doctest::Contains("\"50%\""), std::invalid_argument);
  CHECK(Budget::parse("50B").resolve(shared_profile()) == 50);
  CHECK_THROWS_AS(Budget::bytes(0), std::invalid_argument);
  CHECK_THROWS_AS(Budget::fraction(-0.5), std::invalid_argument);
  CHECK_THROWS_AS(Budget::fraction(NAN), std::invalid_argument);
  const int64_t least = recompose::min_plan_bytes(shared_profile());
  CHECK_THROWS_WITH_AS(recompose::solve_plan(shared_profile(), Budget::bytes(least - 1)),
                       doctest::Contains("below the least any plan holds"), std::invalid_argument);
  CHECK_THROWS_AS(recompose::solve_plan(recompose::MemoryProfile{}, Budget::fraction(0.5)),
                  std::invalid_argument);

  PNet net = make_net();
  auto x = input();
  auto step = [&] { loss_of(net, x).backward(); };
  CHECK_THROWS_AS(recompose::profile_memory(*net, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(
      recompose::profile_memory(*net, step, recompose::ProfileOptions().modules({"blocks.9"})),
      std::invalid_argument);
  CHECK_THROWS_AS(
      recompose::profile_memory(*net, step, recompose::ProfileOptions().modules({"head"})),
      std::invalid_argument);  // not annotated
  CHECK_THROWS_AS(recompose::profile_memory(
                      *net, step, recompose::ProfileOptions().modules({"blocks.1", "blocks.1"})),
                  std::invalid_argument);
  CHECK_THROWS_AS(recompose::profile_memory(*net, [] {}),
                  recompose::CheckpointError);  // nothing saved
  {
    torch::NoGradGuard no_grad;
    CHECK_THROWS_AS(recompose::profile_memory(*net, [&] { loss_of(net, x); }),
                    recompose::CheckpointError);
  }
  // Only two blocks profiled: the plan names only those.
  const auto two = recompose::profile_memory(
      *net, step, recompose::ProfileOptions().modules({"blocks.1", "blocks.3"}));
  REQUIRE(two.modules.size() == 2);
  CHECK(two.modules[1].name == "blocks.3");

  // A plan for another model.
  Plan plan = recompose::solve_plan(shared_profile(), Budget::fraction(0.3));
  Plan renamed = plan;
  renamed.modules[0].name = "layers.0";
  CHECK_THROWS_AS(recompose::apply_plan(*net, renamed), recompose::CheckpointError);
  Plan retyped = plan;
  retyped.modules[0].type = "OtherBlock";
  CHECK_THROWS_AS(recompose::apply_plan(*net, retyped), recompose::CheckpointError);
  Plan bad_op = plan;
  bad_op.modules[0].choice = ModuleChoice::Selective;
  bad_op.modules[0].save = {{"aten::no_such_op.default", 0}};
  CHECK_THROWS_AS(recompose::apply_plan(*net, bad_op), std::invalid_argument);
  for (auto& b : net->blocks) CHECK(!recompose::is_checkpointed(b));  // all or nothing
}

TEST_CASE(
    "planner: offload, forced on CPU, is applied with apply_offload and MUST_SWAP; gradients "
    "bitwise equal") {
  const auto& p = shared_profile();
  // Auto never offloads on CPU (it frees nothing there).
  for (double f : budget_grid(p, 10)) {
    for (const auto& m : recompose::solve_plan(p, Budget::fraction(f)).modules) {
      CHECK(m.choice != ModuleChoice::Offload);
      CHECK(m.swap.empty());
    }
  }
  // Copies that cost nothing: offloading every module is the fastest plan that holds only what
  // one module saves during its own call (its copies start when the call ends) on top of the rest.
  const auto forced =
      recompose::SolveOptions().offload(recompose::OffloadMode::Always).copy_bandwidth(1e15);
  int64_t largest = 0;
  for (const auto& m : p.modules) largest = std::max(largest, m.saved_bytes);
  // With a device, full checkpointing with the inputs in host memory holds nothing.
  CHECK(recompose::min_plan_bytes(p, forced) == p.other_bytes);
  const int64_t least = p.other_bytes + largest;
  const Plan all_offload = recompose::solve_plan(p, Budget::bytes(least), forced);
  for (const auto& m : all_offload.modules) CHECK(m.choice == ModuleChoice::Offload);

  // Selective with swapped ops, written by hand: every keepable op of block 0 swapped.
  Plan swapping = recompose::solve_plan(p, Budget::fraction(1.0));
  swapping.modules[0].choice = ModuleChoice::Selective;
  for (const auto& o : p.modules[0].ops) {
    if (!o.mutated) swapping.modules[0].swap.push_back({o.op, o.call_index});
  }
  swapping.modules[1].choice = ModuleChoice::Offload;
  REQUIRE(!swapping.modules[0].swap.empty());

  const auto plain = grads_under(nullptr);
  for (const Plan* plan : std::vector<const Plan*>{&all_offload, &swapping}) {
    CHECK(rt::bitwise_equal(plain, grads_under(plan)));
    PNet net = make_net();
    recompose::apply_plan(*net, *plan);
    CHECK(recompose::is_offloaded(*net->blocks[1]));
    auto x = input();
    {
      recompose::SavedTensorMeter meter;
      auto loss = loss_of(net, x);
      if (plan == &all_offload)
        CHECK(static_cast<double>(meter.peak_bytes_held()) <= 1.05 * static_cast<double>(least));
      loss.backward();
    }
    CHECK(recompose::remove_plan(*net, *plan) >= 2);
    for (auto& b : net->blocks) CHECK(!recompose::is_offloaded(*b));
    for (auto& b : net->blocks) CHECK(!recompose::is_checkpointed(b));
  }
}

TEST_CASE(
    "planner: on a device the least plan checkpoints every module with its inputs in host memory") {
  const auto& p = shared_profile();
  // A slow link (1 GB/s): offloading what a module saves costs more than recomputing it.
  const auto slow =
      recompose::SolveOptions().offload(recompose::OffloadMode::Always).copy_bandwidth(1e9);
  const int64_t least = recompose::min_plan_bytes(p, slow);
  CHECK(least == p.other_bytes);
  const Plan plan = recompose::solve_plan(p, Budget::bytes(least), slow);
  for (const auto& m : plan.modules) {
    CHECK(m.choice == ModuleChoice::FullSwapInputs);
    CHECK(m.bytes == 0);
  }
  CHECK(Plan::from_json(plan.to_json()) == plan);
  CHECK(plan.to_table().find("full-swap-inputs") != std::string::npos);
  // Without a device (OffloadMode::Auto on a CPU profile) the choice never appears.
  for (double f : budget_grid(p, 10)) {
    for (const auto& m : recompose::solve_plan(p, Budget::fraction(f)).modules) {
      CHECK(m.choice != ModuleChoice::FullSwapInputs);
    }
  }

  // Applied: checkpointed regions whose inputs are swapped; gradients bitwise equal; on CPU the
  // "host" copies stay in process memory, so only the regions' device-side holdings are measured.
  CHECK(rt::bitwise_equal(grads_under(nullptr), grads_under(&plan)));
  PNet net = make_net();
  recompose::apply_plan(*net, plan);
  for (auto& b : net->blocks) CHECK(recompose::is_checkpointed(b));
  auto x = input();
  {
    recompose::SavedTensorMeter meter;
    auto loss = loss_of(net, x);
    // What is left on the "device": the tensors saved outside the blocks.
    CHECK(meter.peak_bytes_held() <=
          static_cast<int64_t>(1.05 * static_cast<double>(p.other_bytes)) + 1024);
    loss.backward();
  }
  CHECK(recompose::remove_plan(*net, plan) == kLayers);
}

namespace {

// Two identical blocks; `delay_ms` stands for what one profiled call of one block may pick up
// besides its work (a cold cache, a preempted thread): a sleep in its forward.
struct TwinBlockImpl : torch::nn::Module {
  explicit TwinBlockImpl(int64_t w) { fc = register_module("fc", torch::nn::Linear(w, w)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    return torch::tanh(fc(torch::relu(x)));  // saves relu's and tanh's outputs, not its input
  }
  torch::nn::Linear fc{nullptr};
  int delay_ms = 0;
};
TORCH_MODULE(TwinBlock);

struct TwinNetImpl : torch::nn::Module {
  TwinNetImpl() {
    a = register_module("a", TwinBlock(64));
    b = register_module("b", TwinBlock(64));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  TwinBlock a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwinNet);

}  // namespace

TEST_CASE(
    "planner: twin modules get the same estimates, and the same model profiled twice the same "
    "plan") {
  torch::manual_seed(1);
  TwinNet net;
  const auto x = torch::randn({256, 64});
  auto step = [&] { net(x).pow(2).mean().backward(); };
  // Profiled twice; each time a different twin is slowed down.
  net->a->delay_ms = 30;
  const auto first = recompose::profile_memory(*net, step);
  net->a->delay_ms = 0;
  net->b->delay_ms = 30;
  const auto second = recompose::profile_memory(*net, step);
  net->b->delay_ms = 0;
  REQUIRE(first.modules.size() == 2);
  REQUIRE(first.modules[0].saved_bytes == second.modules[0].saved_bytes);
  // Each block: none (holds relu's and tanh's outputs) or full (holds its input); the budget
  // fits one full and one none, so which twin to recompute is the plan's one decision.
  const auto& m = first.modules[0];
  const auto budget = Budget::bytes(first.other_bytes + m.saved_bytes + m.input_bytes);
  const Plan plan_first = recompose::solve_plan(first, budget);
  const Plan plan_second = recompose::solve_plan(second, budget);
  for (const Plan* plan : {&plan_first, &plan_second}) {
    REQUIRE(plan->modules.size() == 2);
    CHECK((plan->modules[0].choice == ModuleChoice::None) !=
          (plan->modules[1].choice == ModuleChoice::None));
  }
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    CHECK(plan_first.modules[i].choice == plan_second.modules[i].choice);
    CHECK((plan_first.modules[i].save == plan_second.modules[i].save));
    CHECK((plan_first.modules[i].swap == plan_second.modules[i].swap));
  }
  // Twins are estimated alike: full checkpointing of either costs the same.
  const Plan least = recompose::solve_plan(first, Budget::bytes(recompose::min_plan_bytes(first)));
  REQUIRE(least.modules[0].choice == ModuleChoice::Full);
  CHECK(least.modules[0].seconds == least.modules[1].seconds);
  // ...at the faster twin's time: the 30 ms one call picked up is not in the estimate.
  CHECK(least.modules[0].seconds ==
        std::min(first.modules[0].forward_seconds, first.modules[1].forward_seconds));
  CHECK(first.modules[0].forward_seconds > 0.03);
  // Blocks that differ are no twins: their own times stay.
  const auto different = [&] {
    auto p = first;
    p.modules[1].input_bytes += 4;
    return p;
  }();
  const Plan apart =
      recompose::solve_plan(different, Budget::bytes(recompose::min_plan_bytes(different)));
  CHECK(apart.modules[0].seconds != apart.modules[1].seconds);
}

namespace {

// A block whose forward holds a checkpointed region of its own: the selective replay cannot
// serve the region around it, which runs its forward again instead.
struct NestedBlockImpl : torch::nn::Module {
  explicit NestedBlockImpl(int64_t w) { fc = register_module("fc", torch::nn::Linear(w, w)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto h = fc(x).sin();
    auto inner = recompose::checkpoint([](const torch::Tensor& a) { return a.exp().cos(); }, h);
    return x + inner.tanh();
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(NestedBlock);

struct MixedNetImpl : torch::nn::Module {
  MixedNetImpl() {
    plain = register_module("plain", PBlock(kWidth));
    nested = register_module("nested", NestedBlock(kWidth));
  }
  torch::Tensor forward(torch::Tensor x) { return nested(plain(x)); }
  PBlock plain{nullptr};
  NestedBlock nested{nullptr};
};
TORCH_MODULE(MixedNet);

// Restores the process-wide replay switch.
}  // namespace

TEST_CASE(
    "planner: the profile times each region's recomputation as training runs it: the replay, else "
    "the forward again") {
  auto x = input();
  SUBCASE("replay on (the default): every block replays, and its recomputation is the replay's") {
    ReplaySwitch on(true);
    PNet net = make_net();
    recompose::reset_selective_replay_stats();
    const auto p = recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); });
    const auto stats = recompose::selective_replay_stats();
    // One replay per block in the intercepted run, none falling back to the forward again.
    CHECK(stats.replayed == kLayers);
    CHECK(stats.fallbacks == 0);
    CHECK(stats.replay_ns > 0);
    double replay = 0;
    for (const auto& m : p.modules) {
      CHECK(m.replayed);
      CHECK(m.replay_seconds > 0);
      replay += m.replay_seconds;
    }
    // The blocks' recomputation times are the replays' (host) times, nothing else.
    CHECK(replay == doctest::Approx(static_cast<double>(stats.replay_ns) * 1e-9).epsilon(1e-6));
    CHECK(recompose::selective_replay_enabled());
    CHECK(p.to_string().find("replay") != std::string::npos);
  }
  SUBCASE("replay off: each block's forward runs again, and that is what is timed") {
    ReplaySwitch off(false);
    PNet net = make_net();
    recompose::reset_selective_replay_stats();
    const auto p = recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); });
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.replayed == 0);
    CHECK(stats.fallbacks == kLayers);
    for (const auto& m : p.modules) {
      CHECK(!m.replayed);
      CHECK(m.replay_seconds > 0);
    }
    CHECK(!recompose::selective_replay_enabled());
  }
  SUBCASE("a region the replay cannot serve is timed as its forward again; the others as replays") {
    ReplaySwitch on(true);
    torch::manual_seed(3);
    MixedNet net;
    recompose::reset_selective_replay_stats();
    const auto p = recompose::profile_memory(*net, [&] { net(x).pow(2).mean().backward(); });
    REQUIRE(p.modules.size() == 2);
    CHECK(p.modules[0].name == "plain");
    CHECK(p.modules[0].replayed);
    CHECK(p.modules[1].name == "nested");
    CHECK(!p.modules[1].replayed);
    CHECK(p.modules[1].replay_seconds > 0);
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.fallbacks >= 1);
    CHECK(stats.last_fallback_reason.find("another checkpointed region") != std::string::npos);
    // Plans for it still give gradients bitwise equal to no checkpointing.
    const double lo =
        static_cast<double>(recompose::min_plan_bytes(p)) / static_cast<double>(p.bytes_held);
    for (double f : {lo, (lo + 1) / 2, 1.05}) {
      const Plan plan = recompose::solve_plan(p, Budget::fraction(f));
      auto grads_of = [&](const Plan* pl) {
        torch::manual_seed(3);
        MixedNet fresh;
        if (pl) recompose::apply_plan(*fresh, *pl);
        return rt::grads_of([&] { return fresh(x).pow(2).mean(); }, fresh->parameters());
      };
      const auto want = grads_of(nullptr);
      const auto got = grads_of(&plan);
      REQUIRE(want.size() == got.size());
      for (size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i], got[i]));
    }
  }
}

TEST_CASE(
    "planner: the profile measures each module's backward, and the time line and the plan use it") {
  const auto& p = shared_profile();
  REQUIRE(p.modules.size() == kLayers);
  double backwards = 0, forwards = 0;
  for (const auto& m : p.modules) {
    CHECK(m.backward_seconds > 0);  // measured, one per module
    backwards += m.backward_seconds;
    forwards += m.forward_seconds;
  }
  CHECK(p.backward_measured());
  // Spans inside the step, beside the forwards: never more than the step.
  CHECK(backwards + forwards <= p.step_seconds);
  const auto c = recompose::detail::step_compute_of(p);
  for (size_t i = 0; i < kLayers; ++i)
    CHECK(c.modules[i].backward_seconds == doctest::Approx(p.modules[i].backward_seconds));
  CHECK(p.to_string().find("backward: measured per module") != std::string::npos);
  const Plan plan = recompose::solve_plan(p, Budget::fraction(0.5));
  CHECK(plan.backward_measured);
  CHECK(plan.to_table().find("backward as profiled") != std::string::npos);
  CHECK(Plan::from_json(plan.to_json()) == plan);
  const auto back = recompose::MemoryProfile::from_json(p.to_json());
  for (size_t i = 0; i < kLayers; ++i) {
    CHECK(back.modules[i].backward_seconds == p.modules[i].backward_seconds);
    CHECK(back.modules[i].replayed == p.modules[i].replayed);
  }
}

TEST_CASE(
    "planner: a profile under checkpoint_sequential keeps its ops' reads within each module") {
  // The segments recompute the blocks inside backward; what the blocks' ops read there must not
  // land in the profile (each op reads earlier ops of its own module's forward call).
  torch::manual_seed(7);
  torch::nn::Sequential seq;
  for (int i = 0; i < 4; ++i) seq->push_back(PBlock(kWidth));
  const auto x = input().requires_grad_();
  const auto profile = recompose::profile_memory(
      *seq, [&] { recompose::checkpoint_sequential(seq, 2, x).pow(2).mean().backward(); });
  int64_t reads = 0;
  for (const auto& m : profile.modules) {
    for (size_t i = 0; i < m.ops.size(); ++i) {
      for (const int64_t r : m.ops[i].reads) {
        CAPTURE(m.name);
        CAPTURE(i);
        CHECK(r < static_cast<int64_t>(i));
        ++reads;
      }
    }
  }
  CHECK(reads > 0);
  CHECK_NOTHROW(recompose::MemoryProfile::from_json(profile.to_json()));
  // The recomputations are not calls of the step's forward: each block is called once, and its
  // ops, their outputs and its input are counted once.
  for (const auto& m : profile.modules) {
    CAPTURE(m.name);
    CHECK(m.calls == 1);
    // The first block's input is a leaf that needs gradients (never counted), the others' are
    // the blocks' outputs.
    CHECK(m.input_bytes == (m.name == "0" ? 0 : x.numel() * 4));
  }
}

namespace {
// One tensor fanned out to two blocks (as an FPN's encoder features or a U-Net's skips).
struct FanOutImpl : torch::nn::Module {
  FanOutImpl() {
    pre = register_module("pre", torch::nn::Linear(kWidth, kWidth));
    a = register_module("a", PBlock(kWidth));
    b = register_module("b", PBlock(kWidth));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = pre(x);
    auto from_a = a(h);  // a first: the operands of + are evaluated in no fixed order
    return from_a + b(h);
  }
  torch::nn::Linear pre{nullptr};
  PBlock a{nullptr}, b{nullptr};
};
TORCH_MODULE(FanOut);
}  // namespace

TEST_CASE("planner: an input two modules take is counted once, and the least plan fits it") {
  torch::manual_seed(3);
  FanOut net;
  const auto x = input();
  const auto profile = recompose::profile_memory(*net, [&] { net(x).pow(2).mean().backward(); });
  REQUIRE(profile.modules.size() == 2);
  const int64_t h_bytes = x.numel() * 4;  // pre's output, the input of both blocks
  CHECK(profile.modules[0].input_bytes == h_bytes);
  CHECK(profile.modules[0].shared_input_bytes == h_bytes);
  CHECK(profile.modules[1].input_bytes == 0);
  CHECK(recompose::MemoryProfile::from_json(profile.to_json()).modules[0].shared_input_bytes ==
        h_bytes);
  // Both blocks fully checkpointed hold the shared input once: the least plan's estimate is not
  // above what that holds.
  FanOut full;
  recompose::apply_checkpoint(*full->a);
  recompose::apply_checkpoint(*full->b);
  int64_t held = 0;
  {
    recompose::SavedTensorMeter meter;
    auto loss = full(x).pow(2).mean();
    held = meter.bytes_held();
    loss.backward();
  }
  CHECK(recompose::min_plan_bytes(profile) <= held);
  // A plan at that least still trains bitwise as plain.
  const Plan least =
      recompose::solve_plan(profile, Budget::bytes(recompose::min_plan_bytes(profile)));
  torch::manual_seed(3);
  FanOut plain_net, planned_net;
  torch::manual_seed(3);
  planned_net = FanOut();
  recompose::apply_plan(*planned_net, least);
  torch::manual_seed(3);
  plain_net = FanOut();
  torch::manual_seed(5);
  const auto plain =
      rt::grads_of([&] { return plain_net(x).pow(2).mean(); }, plain_net->parameters());
  torch::manual_seed(5);
  const auto planned =
      rt::grads_of([&] { return planned_net(x).pow(2).mean(); }, planned_net->parameters());
  CHECK(rt::bitwise_equal(plain, planned));
}

namespace {

// A configuration as candidate_plans compares them: per module its choice, kept and swapped ops.
bool same_configuration(const Plan& a, const Plan& b) {
  if (a.modules.size() != b.modules.size()) return false;
  for (size_t i = 0; i < a.modules.size(); ++i) {
    const auto &x = a.modules[i], &y = b.modules[i];
    if (x.name != y.name || x.choice != y.choice || !(x.save == y.save) || !(x.swap == y.swap))
      return false;
  }
  return true;
}

// Every module of `p` under one choice, or (Selective) keeping what transformer_policy keeps;
// `every_second`: with every second aten::mm recomputed. Only the configuration and the bytes the
// solver's pricing gives it (estimated bytes, without what a plan holds besides the modules).
Plan preset_by_hand(const recompose::MemoryProfile& p, ModuleChoice choice,
                    bool every_second = false) {
  Plan plan;
  for (const auto& m : p.modules) {
    recompose::ModulePlan mp;
    mp.name = m.name;
    mp.type = m.type;
    mp.choice = choice;
    switch (choice) {
      case ModuleChoice::None:
        mp.bytes = m.saved_bytes;
        break;
      case ModuleChoice::Full:
        mp.bytes = m.input_bytes;
        break;
      case ModuleChoice::Offload:
        mp.bytes = m.shared_input_bytes;
        break;
      default: {
        mp.bytes = m.input_bytes + m.draw_bytes;
        const auto list = recompose::detail::transformer_save_list();
        for (const auto& o : m.ops) {
          const bool keepable = (!o.mutated || o.carries_write) && !o.inplace && !o.view &&
                                o.op.rfind("aten::empty", 0) != 0 &&
                                o.op.rfind("aten::new_empty", 0) != 0;
          const bool listed = std::find(list.begin(), list.end(), o.op) != list.end();
          if (!keepable || !listed) continue;
          if (every_second && o.op == "aten::mm.default" && o.call_index % 2 == 1) continue;
          mp.save.push_back({o.op, o.call_index});
          mp.bytes += o.output_bytes;
        }
      }
    }
    plan.bytes += mp.bytes;
    plan.modules.push_back(mp);
  }
  return plan;
}

bool solver_or_transformer(const recompose::PlanCandidate& c) {
  return c.name.rfind("solver (", 0) == 0 || c.name == "transformer_policy";
}

// solve_plan's plan is the fastest of candidate_plans' solver and transformer_policy candidates.
void check_solve_plan_is_fastest(const recompose::MemoryProfile& p, const Budget& budget,
                                 const recompose::SolveOptions& options) {
  const auto cs = recompose::candidate_plans(p, budget, options);
  const Plan plan = recompose::solve_plan(p, budget, options);
  auto best = std::find_if(cs.begin(), cs.end(), solver_or_transformer);
  REQUIRE(best != cs.end());
  CHECK((best->plan.modules == plan.modules));
  CHECK(best->plan.bytes == plan.bytes);
  CHECK(best->plan.step_seconds == plan.step_seconds);
  CHECK(best->plan.peak_bytes == plan.peak_bytes);
  CHECK(best->plan.budget_bytes == plan.budget_bytes);
}

}  // namespace

TEST_CASE(
    "planner: candidate_plans lists the solver's plans and the presets that fit, each estimated "
    "by the solver's pricing, fastest first; solve_plan takes the fastest solver plan") {
  const auto& p = shared_profile();
  const recompose::SolveOptions no_copies;
  const auto copies =
      recompose::SolveOptions().offload(recompose::OffloadMode::Always).copy_bandwidth(2e9);
  int64_t inputs = 0, largest = 0;
  for (const auto& m : p.modules)
    inputs += m.input_bytes, largest = std::max(largest, m.saved_bytes);
  // What the solver's pricing gives full checkpointing: the least plan without copies.
  const Plan least = recompose::solve_plan(p, Budget::bytes(recompose::min_plan_bytes(p)));
  for (const auto& m : least.modules) REQUIRE(m.choice == ModuleChoice::Full);

  for (const bool offload : {false, true}) {
    CAPTURE(offload);
    const auto* options = offload ? &copies : &no_copies;
    // Every preset fits.
    const auto cs = recompose::candidate_plans(p, Budget::fraction(1.5), *options);
    REQUIRE(!cs.empty());
    std::set<std::string> names;
    for (size_t i = 0; i < cs.size(); ++i) {
      CAPTURE(cs[i].name);
      CHECK(names.insert(cs[i].name).second);
      CHECK(cs[i].plan.bytes <= cs[i].plan.budget_bytes);
      CHECK(cs[i].plan.budget_bytes == Budget::fraction(1.5).resolve(p));
      CHECK(cs[i].plan.peak_bytes > 0);
      CHECK(cs.front().plan.step_seconds <= cs[i].plan.step_seconds);
      if (i > 0) CHECK(cs[i - 1].plan.step_seconds <= cs[i].plan.step_seconds);
      for (size_t j = 0; j < i; ++j) CHECK(!same_configuration(cs[i].plan, cs[j].plan));
    }
    for (const auto& name : names) {
      const std::set<std::string> known = {
          "solver (no copies)", "solver (swaps)",  "solver (offload)", "none", "full",
          "transformer_policy", "every second mm", "offload"};
      CHECK(known.count(name) == 1);
      if (!offload) CHECK((name != "solver (swaps)" && name != "solver (offload)"));
    }
    // Each preset once: under its name, or under an earlier one with the same configuration.
    struct Preset {
      const char* name;
      Plan want;
      int64_t base;  // what a plan holds besides the modules
    };
    const std::vector<Preset> presets = {
        {"none", preset_by_hand(p, ModuleChoice::None), p.other_bytes},
        {"full", preset_by_hand(p, ModuleChoice::Full), p.other_bytes},
        {"transformer_policy", preset_by_hand(p, ModuleChoice::Selective), p.other_bytes},
        {"every second mm", preset_by_hand(p, ModuleChoice::Selective, true), p.other_bytes},
        {"offload", preset_by_hand(p, ModuleChoice::Offload), p.other_bytes + largest}};
    for (const auto& preset : presets) {
      CAPTURE(preset.name);
      const bool listed_at_all = std::string(preset.name) != "offload" || offload;
      auto it = std::find_if(cs.begin(), cs.end(), [&](const recompose::PlanCandidate& c) {
        return same_configuration(c.plan, preset.want);
      });
      REQUIRE((it != cs.end()) == listed_at_all);
      if (it == cs.end()) continue;
      if (it->name != preset.name) {
        // An earlier name: a solver family or an earlier preset.
        const bool earlier = solver_or_transformer(*it) || it->name == "none" ||
                             it->name == "full" || it->name == "transformer_policy";
        CHECK(earlier);
      }
      CHECK(it->plan.bytes == preset.base + preset.want.bytes);
      double added = p.step_seconds;
      for (size_t i = 0; i < it->plan.modules.size(); ++i) {
        CHECK(it->plan.modules[i].bytes == preset.want.modules[i].bytes);
        added += it->plan.modules[i].seconds;
      }
      // At least the modules' costs added up (the simulated step may be longer).
      CHECK(it->plan.step_seconds >= doctest::Approx(added));
    }
    // The estimates the solver's pricing gives: none holds what the profile held, full its
    // inputs, each module for its forward run again.
    auto none = std::find_if(cs.begin(), cs.end(), [&](const recompose::PlanCandidate& c) {
      return same_configuration(c.plan, presets[0].want);
    });
    CHECK(none->plan.bytes == p.bytes_held);
    CHECK(none->plan.step_seconds == doctest::Approx(p.step_seconds));
    auto full = std::find_if(cs.begin(), cs.end(), [&](const recompose::PlanCandidate& c) {
      return same_configuration(c.plan, presets[1].want);
    });
    CHECK(full->plan.bytes == p.other_bytes + inputs);
    CHECK((full->plan.modules == least.modules));

    // A small budget: the presets that do not fit are absent, every candidate fits.
    const int64_t small = p.other_bytes + inputs;  // full checkpointing's
    const auto few = recompose::candidate_plans(p, Budget::bytes(small), *options);
    REQUIRE(!few.empty());
    for (const auto& c : few) {
      CAPTURE(c.name);
      CHECK(c.plan.bytes <= small);
      CHECK(few.front().plan.step_seconds <= c.plan.step_seconds);
      for (const auto& preset : presets) {
        if (preset.base + preset.want.bytes > small)
          CHECK(!same_configuration(c.plan, preset.want));
      }
    }
    CHECK(std::any_of(few.begin(), few.end(), [&](const recompose::PlanCandidate& c) {
      return same_configuration(c.plan, presets[1].want);
    }));
    CHECK(std::none_of(few.begin(), few.end(),
                       [](const recompose::PlanCandidate& c) { return c.name == "none"; }));

    // A peak budget: every candidate's simulated peak fits (no allocator headroom on CPU).
    const int64_t peak = recompose::min_plan_peak_bytes(p, *options) + p.bytes_held / 4;
    for (const auto& c : recompose::candidate_plans(p, Budget::peak_bytes(peak), *options)) {
      CAPTURE(c.name);
      CHECK(c.plan.peak_bytes <= peak);
      CHECK(c.plan.bytes <= c.plan.budget_bytes);
    }

    // solve_plan's plan is the fastest solver or transformer_policy candidate, at every budget.
    for (double f : budget_grid(p, 20)) {
      CAPTURE(f);
      check_solve_plan_is_fastest(p, Budget::fraction(f), *options);
    }
    check_solve_plan_is_fastest(p, Budget::peak_bytes(peak), *options);
    // The errors of solve_plan.
    CHECK_THROWS_WITH_AS(
        recompose::candidate_plans(p, Budget::bytes(recompose::min_plan_bytes(p, *options) - 1),
                                   *options),
        doctest::Contains("below the least any plan holds"), std::invalid_argument);
  }
  CHECK_THROWS_AS(recompose::candidate_plans(recompose::MemoryProfile{}, Budget::fraction(0.5)),
                  std::invalid_argument);
}
