// The planner's model of a selective replay (lib/planner/replay_cost.h): a dropped op costs its
// recomputation only when backward needs its output; outputs written in place before anything
// reads them may be kept (the kept output carries the write). And what the profiler records for
// it: what each op reads, what autograd saves, which writes are carried.
#include "planner/op_times.h"
#include "planner/replay_cost.h"
#include "selective/policy_warnings.h"
#include "selective/summarizing_contexts.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

using recompose::Budget;
using recompose::MemoryProfile;
using recompose::ModuleChoice;
using recompose::ModuleProfile;
using recompose::OpProfile;
using recompose::Plan;

namespace {

constexpr double kMs = 1e-3;
constexpr int64_t kBytes = 1000;

OpProfile op(std::string name, double ms, std::vector<int64_t> reads, bool saved) {
  OpProfile o;
  o.op = std::move(name);
  o.output_bytes = kBytes;
  o.seconds = ms * kMs;
  o.reads = std::move(reads);
  o.saved_for_backward = saved;
  return o;
}

// One module that replays; its fixed cost is 0.5 ms.
MemoryProfile profile_of(std::vector<OpProfile> ops, bool dependencies = true) {
  ModuleProfile m;
  m.name = "block";
  m.type = "Block";
  m.calls = 1;
  m.input_bytes = kBytes;
  m.saved_bytes = kBytes * static_cast<int64_t>(ops.size() + 1);
  double forward = 0;
  for (const auto& o : ops) forward += o.seconds;
  m.forward_seconds = m.selective_forward_seconds = forward;
  m.replay_seconds = 0.5 * kMs;
  m.replayed = true;
  m.backward_seconds = 2 * forward;
  m.ops = std::move(ops);
  m.dependencies_recorded = dependencies;
  MemoryProfile p;
  p.device = "cpu";
  p.bytes_held = m.saved_bytes;
  p.step_seconds = 3 * forward;
  p.modules.push_back(std::move(m));
  return p;
}

std::vector<bool> answered(std::initializer_list<bool> flags) { return flags; }

bool keeps(const Plan& plan, const std::string& name) {
  const auto& save = plan.modules.at(0).save;
  return std::any_of(save.begin(), save.end(), [&](const auto& o) { return o.op == name; });
}

// A module with an output written in place before anything reads it (mm's, as a 2-d Linear's
// bias), and one read and then written (gelu's).
struct WriteBlockImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto y = torch::mm(x, x.t());
    y.add_(1.0);                    // first thing after mm: carried by a kept mm
    auto g = torch::gelu(y);        // gelu saves its input, y
    auto skip = torch::sigmoid(g);  // reads g ...
    g.mul_(0.5);                    // ... before this write: keeping g would need a copy
    return torch::tanh(g + skip);   // tanh saves its output
  }
};
TORCH_MODULE(WriteBlock);

struct WriteNetImpl : torch::nn::Module {
  WriteNetImpl() { block = register_module("block", WriteBlock()); }
  torch::Tensor forward(torch::Tensor x) { return block(x); }
  WriteBlock block{nullptr};
};
TORCH_MODULE(WriteNet);

const OpProfile& find_op(const ModuleProfile& m, const std::string& name) {
  auto it =
      std::find_if(m.ops.begin(), m.ops.end(), [&](const OpProfile& o) { return o.op == name; });
  REQUIRE(it != m.ops.end());
  return *it;
}

int64_t index_of(const ModuleProfile& m, const std::string& name) {
  return std::distance(
      m.ops.begin(),
      std::find_if(m.ops.begin(), m.ops.end(), [&](const OpProfile& o) { return o.op == name; }));
}

// A 3-d Linear (mm, then _unsafe_view of its output, then the bias added in place through that
// view) and dropout (bernoulli_ drawing into empty_like's output).
struct AliasWriteBlockImpl : torch::nn::Module {
  AliasWriteBlockImpl() { fc = register_module("fc", torch::nn::Linear(8, 8)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::tanh(torch::dropout(fc(x), 0.25, /*train=*/true));
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(AliasWriteBlock);

// mm's output written in place with sin's: a replay that runs mm runs the write, and needs sin.
struct WriteReadsBlockImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto s = torch::sin(x);
    auto y = torch::mm(x, x.t());
    y.add_(s);
    return torch::tanh(y);  // saves its output
  }
};
TORCH_MODULE(WriteReadsBlock);

// The same with sin made after mm: mm's reads point forward.
struct LateWriteReadsBlockImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto y = torch::mm(x, x.t());
    auto s = torch::sin(x);
    y.add_(s);
    return torch::tanh(y);
  }
};
TORCH_MODULE(LateWriteReadsBlock);

// Dropout on CPU draws with bernoulli_ into a fresh tensor: a selective region keeps the draw as
// bits (one per element) for its replay.
struct DropoutBlockImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::tanh(torch::dropout(torch::sin(x), 0.5, /*train=*/true));
  }
};
TORCH_MODULE(DropoutBlock);

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE("planner: a dropped op whose output nothing needs costs nothing") {
    // mm's output is saved (by the op after it); relu's output only leaves the module.
    const MemoryProfile p =
        profile_of({op("aten::mm.default", 4, {}, true), op("aten::relu.default", 2, {0}, false)});
    const recompose::detail::ReplayCost cost(p.modules[0]);
    CHECK(cost.walks());
    CHECK(cost.seconds(answered({false, false})) == doctest::Approx(4 * kMs));
    CHECK(cost.seconds(answered({true, false})) == 0);
    // Keeping mm alone holds the input and mm's output; relu, dropped, is not charged: the fixed
    // 0.5 ms only (charging every dropped op made it 2.5 ms).
    const Plan plan = recompose::solve_plan(p, Budget::bytes(2 * kBytes));
    REQUIRE(plan.modules[0].choice == ModuleChoice::Selective);
    CHECK(keeps(plan, "aten::mm.default"));
    CHECK(!keeps(plan, "aten::relu.default"));
    CHECK(plan.modules[0].seconds == doctest::Approx(0.5 * kMs));
  }

  TEST_CASE("planner: a dropped op that a needed op reads is charged, transitively") {
    // mm -> add -> tanh: only tanh's output is saved; mm and add are needed through it.
    const MemoryProfile p =
        profile_of({op("aten::mm.default", 4, {}, false), op("aten::add.Tensor", 1, {0}, false),
                    op("aten::tanh.default", 2, {1}, true)});
    const recompose::detail::ReplayCost cost(p.modules[0]);
    CHECK(cost.seconds(answered({false, false, false})) == doctest::Approx(7 * kMs));
    CHECK(cost.runs(answered({false, false, false})) == std::vector<bool>{true, true, true});
    // add kept: tanh runs from it, mm is not needed.
    CHECK(cost.seconds(answered({false, true, false})) == doctest::Approx(2 * kMs));
    // mm kept: add and tanh run.
    CHECK(cost.seconds(answered({true, false, false})) == doctest::Approx(3 * kMs));
    CHECK(cost.seconds(answered({false, false, true})) == 0);
    // The greedy keeps tanh first (7 ms saved for its bytes): one op, 0.5 ms.
    const Plan plan = recompose::solve_plan(p, Budget::bytes(2 * kBytes));
    CHECK(keeps(plan, "aten::tanh.default"));
    CHECK(plan.modules[0].seconds == doctest::Approx(0.5 * kMs));
  }

  TEST_CASE("planner: without the ops' dependencies every dropped op is charged, as before") {
    const MemoryProfile old =
        profile_of({op("aten::mm.default", 4, {}, true), op("aten::relu.default", 2, {0}, false)},
                   /*dependencies=*/false);
    const recompose::detail::ReplayCost cost(old.modules[0]);
    CHECK(!cost.walks());
    CHECK(cost.seconds(answered({true, false})) == doctest::Approx(2 * kMs));
    const Plan plan = recompose::solve_plan(old, Budget::bytes(2 * kBytes));
    CHECK(keeps(plan, "aten::mm.default"));
    CHECK(plan.modules[0].seconds == doctest::Approx(2.5 * kMs));
    // A module that reruns its forward runs every op not kept, whatever the profile knows.
    MemoryProfile rerun =
        profile_of({op("aten::mm.default", 4, {}, true), op("aten::relu.default", 2, {0}, false)});
    rerun.modules[0].replayed = false;
    CHECK(recompose::detail::ReplayCost(rerun.modules[0]).seconds(answered({true, false})) ==
          doctest::Approx(2 * kMs));
  }

  TEST_CASE("planner: an output written before anything reads it may be kept, one read first not") {
    // bmm's output gets the mask added in place first (carried); softmax's is read, then written.
    OpProfile bmm = op("aten::bmm.default", 4, {}, false);
    bmm.mutated = bmm.carries_write = true;
    OpProfile softmax = op("aten::softmax.int", 4, {0}, true);
    softmax.mutated = true;
    const MemoryProfile p = profile_of({bmm, softmax, op("aten::mul.Tensor", 1, {1}, true)});
    // Room for everything: only what may be kept is.
    const Plan plan = recompose::solve_plan(p, Budget::bytes(3 * kBytes));
    REQUIRE(plan.modules[0].choice == ModuleChoice::Selective);
    CHECK(keeps(plan, "aten::bmm.default"));
    CHECK(!keeps(plan, "aten::softmax.int"));
    CHECK(keeps(plan, "aten::mul.Tensor"));
    // softmax, dropped and needed, runs from the kept bmm.
    CHECK(plan.modules[0].seconds == doctest::Approx(4.5 * kMs));
  }

  TEST_CASE("planner: an op that only allocates is never kept, whatever it costs") {
    // Dropout on CPU: empty_like, then bernoulli_ draws into it in place (its time lands on the
    // next op the policy sees); keeping the allocation keeps no value. Per byte it would be the
    // best keep here (3 ms for 1 kB, the mul 4 ms for 5 kB), and the budget fits it.
    OpProfile empty = op("aten::empty_like.default", 3, {}, false);
    empty.mutated = empty.carries_write = true;
    OpProfile mul = op("aten::mul.Tensor", 1, {0}, true);
    mul.output_bytes = 5 * kBytes;
    const MemoryProfile p = profile_of({empty, mul, op("aten::exp.default", 1, {1}, true)});
    const Plan plan = recompose::solve_plan(p, Budget::bytes(3 * kBytes));
    REQUIRE(plan.modules[0].choice == ModuleChoice::Selective);
    CHECK(!keeps(plan, "aten::empty_like.default"));
    CHECK(keeps(plan, "aten::exp.default"));
  }

  TEST_CASE(
      "planner: the profile records what each op reads, what autograd saves, carried writes") {
    WriteNet net;
    torch::manual_seed(3);
    auto x = torch::randn({8, 8}, torch::requires_grad());
    const MemoryProfile p = recompose::profile_memory(*net, [&] { net(x).sum().backward(); });
    const MemoryProfile back = MemoryProfile::from_json(p.to_json());
    for (const MemoryProfile* q : {&p, &back}) {
      REQUIRE(q->modules.size() == 1);
      const ModuleProfile& m = q->modules[0];
      CHECK(m.dependencies_recorded);
      const OpProfile& mm = find_op(m, "aten::mm.default");
      const OpProfile& gelu = find_op(m, "aten::gelu.default");
      const OpProfile& sigmoid = find_op(m, "aten::sigmoid.default");
      const OpProfile& add = find_op(m, "aten::add.Tensor");
      const OpProfile& tanh = find_op(m, "aten::tanh.default");
      CHECK(mm.mutated);
      CHECK(mm.carries_write);
      CHECK(gelu.mutated);
      CHECK(!gelu.carries_write);
      CHECK(!sigmoid.mutated);
      // gelu saves its input (mm's output after the add_), sigmoid and tanh their outputs.
      CHECK(mm.saved_for_backward);
      CHECK(!gelu.saved_for_backward);
      CHECK(sigmoid.saved_for_backward);
      CHECK(!add.saved_for_backward);
      CHECK(tanh.saved_for_backward);
      CHECK(mm.reads.empty());  // x comes from outside the module
      CHECK(gelu.reads == std::vector<int64_t>{index_of(m, "aten::mm.default")});
      CHECK(sigmoid.reads == std::vector<int64_t>{index_of(m, "aten::gelu.default")});
      std::vector<int64_t> add_reads{index_of(m, "aten::gelu.default"),
                                     index_of(m, "aten::sigmoid.default")};
      std::sort(add_reads.begin(), add_reads.end());
      CHECK(add.reads == add_reads);
      CHECK(tanh.reads == std::vector<int64_t>{index_of(m, "aten::add.Tensor")});
    }
    // A profile written before these fields loads with none of them (every op charged).
    std::string old = p.to_json();
    for (const char* key : {"\"dependencies_recorded\"", "\"carries_write\"", "\"reads\"",
                            "\"saved_for_backward\""}) {
      CHECK(old.find(key) != std::string::npos);
    }
    const MemoryProfile v1 =
        MemoryProfile::load(std::string(RECOMPOSE_SOURCE_DIR) + "/tests/data/profile-v1.json");
    for (const auto& m : v1.modules) {
      CHECK(!m.dependencies_recorded);
      for (const auto& o : m.ops)
        CHECK((o.reads.empty() && !o.saved_for_backward && !o.carries_write));
    }
  }

  TEST_CASE(
      "planner: a write through an alias, a random write: the profile says what keeping each "
      "costs, as the forward keeps it") {
    AliasWriteBlock block;
    auto x = torch::randn({2, 4, 8}, torch::requires_grad());
    auto step = [&] { block(x).sum().backward(); };
    const MemoryProfile p = recompose::profile_memory(*block, step);
    REQUIRE(p.modules.size() == 1);
    const ModuleProfile& m = p.modules[0];
    const OpProfile& mm = find_op(m, "aten::mm.default");
    const OpProfile& unsafe_view = find_op(m, "aten::_unsafe_view.default");
    const OpProfile& empty = find_op(m, "aten::empty_like.default");
    // The bias lands in mm's storage: mm's kept output carries it; _unsafe_view's (an alias, not
    // the storage's maker) would keep a copy of the value before it.
    CHECK(mm.mutated);
    CHECK(mm.carries_write);
    CHECK(unsafe_view.mutated);
    CHECK(!unsafe_view.carries_write);
    // A random write is never carried.
    CHECK(empty.mutated);
    CHECK(!empty.carries_write);
    // What the forward does with each kept alone: the write carried only by mm's kept output.
    auto carried_keeping = [&](const char* name) {
      block->zero_grad();
      recompose::apply_checkpoint(
          *block, recompose::CheckpointOptions().policy(recompose::SelectivePolicy({name})));
      recompose::reset_selective_replay_stats();
      step();
      recompose::remove_checkpoint(*block);
      return recompose::selective_replay_stats().writes_carried;
    };
    CHECK(carried_keeping("aten::mm.default") == 1);
    CHECK(carried_keeping("aten::_unsafe_view.default") == 0);
  }

  TEST_CASE(
      "planner: what a write into an op's output reads, the op reads (the replay runs both)") {
    WriteReadsBlock block;
    auto x = torch::randn({6, 6}, torch::requires_grad());
    const MemoryProfile p = recompose::profile_memory(*block, [&] { block(x).sum().backward(); });
    const ModuleProfile& m = p.modules.at(0);
    const int64_t sin = index_of(m, "aten::sin.default");
    const int64_t mm = index_of(m, "aten::mm.default");
    const int64_t tanh = index_of(m, "aten::tanh.default");
    CHECK(find_op(m, "aten::mm.default").reads == std::vector<int64_t>{sin});
    CHECK(find_op(m, "aten::tanh.default").reads == std::vector<int64_t>{mm});
    // Nothing kept: tanh's saved output needs tanh, mm and, through the write, sin.
    const recompose::detail::ReplayCost cost(m);
    REQUIRE(cost.walks());
    const std::vector<bool> runs = cost.runs(std::vector<bool>(m.ops.size(), false));
    CHECK(runs[static_cast<size_t>(sin)]);
    CHECK(runs[static_cast<size_t>(mm)]);
    CHECK(runs[static_cast<size_t>(tanh)]);
    // mm kept (its output carries the write): sin is not needed.
    std::vector<bool> keep_mm(m.ops.size(), false);
    keep_mm[static_cast<size_t>(mm)] = true;
    CHECK(!cost.runs(keep_mm)[static_cast<size_t>(sin)]);
  }

  TEST_CASE("planner: a write's read of a later op: the walk goes back for it") {
    LateWriteReadsBlock block;
    auto x = torch::randn({6, 6}, torch::requires_grad());
    const MemoryProfile p = recompose::profile_memory(*block, [&] { block(x).sum().backward(); });
    const ModuleProfile& m = p.modules.at(0);
    const int64_t sin = index_of(m, "aten::sin.default");
    const int64_t mm = index_of(m, "aten::mm.default");
    REQUIRE(sin > mm);
    CHECK(find_op(m, "aten::mm.default").reads == std::vector<int64_t>{sin});
    const MemoryProfile back = MemoryProfile::from_json(p.to_json());  // a forward read loads
    CHECK(back.modules.at(0).ops.at(static_cast<size_t>(mm)).reads == std::vector<int64_t>{sin});
    const recompose::detail::ReplayCost cost(m);
    REQUIRE(cost.walks());
    CHECK(cost.runs(std::vector<bool>(m.ops.size(), false))[static_cast<size_t>(sin)]);
  }

  TEST_CASE("planner: a selective module holds the draws it keeps as bits, whatever it keeps") {
    // Measured: 4 x 8 floats drawn, 32 bits kept.
    DropoutBlock block;
    auto x = torch::randn({4, 8}, torch::requires_grad());
    const MemoryProfile p = recompose::profile_memory(*block, [&] { block(x).sum().backward(); });
    CHECK(p.modules.at(0).draw_bytes == 4);
    CHECK(MemoryProfile::from_json(p.to_json()).modules.at(0).draw_bytes == 4);
    // Priced: a selective plan's bytes count them beside its input and what it keeps.
    MemoryProfile q =
        profile_of({op("aten::exp.default", 1, {}, true), op("aten::sin.default", 1, {0}, true)});
    q.modules[0].draw_bytes = 300;
    const Plan plan = recompose::solve_plan(q, Budget::bytes(2 * kBytes + 300));
    REQUIRE(plan.modules.at(0).choice == ModuleChoice::Selective);
    CHECK(plan.modules[0].bytes == 2 * kBytes + 300);  // input, one op kept, the draws
    CHECK(plan.bytes == plan.modules[0].bytes);
  }

  TEST_CASE("planner: a summary times each draw kept as bits, and no other op") {
    // Dropout on CPU: empty_like, bernoulli_ (a write that draws: kept as bits), div_, mul.
    DropoutBlock block;
    std::vector<recompose::detail::ForwardSummary> summaries;
    const recompose::SelectivePolicy recompute_all([](const auto&, const auto&, const auto&) {
      return recompose::CheckpointPolicy::PREFER_RECOMPUTE;
    });
    recompose::apply_checkpoint(*block, recompose::CheckpointOptions().context_fn([&] {
      return recompose::detail::create_summarizing_contexts(
          recompute_all, true,
          [&](recompose::detail::ForwardSummary&& s) { summaries.push_back(std::move(s)); });
    }));
    auto x = torch::randn({64, 64}, torch::requires_grad());
    {
      recompose::detail::PolicyWarningsOff quiet;  // keeping nothing is meant here
      block(x).sum().backward();
    }
    REQUIRE(summaries.size() == 1);
    int draws = 0;
    for (const auto& op : summaries[0].ops) {
      CAPTURE(op.op.operator_name().name);
      if (op.kind == recompose::detail::SummaryOp::Kind::Write && op.draw_bytes > 0) {
        CHECK(op.draw_seconds > 0);
        ++draws;
      } else {
        CHECK(op.draw_seconds == 0);
      }
    }
    CHECK(draws == 1);
  }

  TEST_CASE(
      "planner: a draw kept as bits is no op's recomputation, and the spans sum to the "
      "plain forward") {
    // Run 2's spans: dropout's mul holds its bernoulli_ (2 of its 3 ms), which a replay writes
    // back from the kept bits. The spans sum to 5 ms, the plain forward took 4 ms, the
    // intercepted one 6 ms. (Note [ A kept draw is no op's recomputation ], op_times.cpp.)
    MemoryProfile p =
        profile_of({op("aten::mm.default", 1, {}, false), op("aten::mul.Tensor", 3, {0}, true),
                    op("aten::tanh.default", 1, {1}, true)});
    ModuleProfile& m = p.modules[0];
    m.forward_seconds = 4 * kMs;
    m.selective_forward_seconds = 6 * kMs;
    ModuleProfile forward_again = m;  // recomputes by running its forward again: draws again
    forward_again.replayed = false;
    const std::vector<double> draws{0.0, 2 * kMs};  // shorter than the ops: none in tanh's span
    recompose::detail::settle_op_times(m, draws);
    recompose::detail::settle_op_times(forward_again, draws);
    for (const auto& o : m.ops) CHECK(o.seconds == doctest::Approx(0.8 * kMs));  // x 4/5
    CHECK(m.selective_forward_seconds == doctest::Approx(5 * kMs));  // 1 ms outside the spans
    CHECK(forward_again.ops[1].seconds == doctest::Approx(2.4 * kMs));
    // Dropping mul (saved for backward: the replay runs it) adds what the times say: the
    // intercepted forward over the plain one, the replay's own 0.5 ms, mul without its draw.
    Plan plan = recompose::solve_plan(p, Budget::fraction(1.0));
    plan.modules.at(0).choice = ModuleChoice::Selective;
    plan.modules[0].save = {{"aten::mm.default", 0}, {"aten::tanh.default", 0}};
    const Plan priced = recompose::estimate_plan(p, plan);
    CHECK(priced.modules.at(0).seconds == doctest::Approx((1 + 0.5 + 0.8) * kMs));
    CHECK(priced.step_seconds == doctest::Approx(p.step_seconds + 2.3 * kMs));
  }

  TEST_CASE("planner: a kept draw lands in the span of the next op a policy saw") {
    // The forward as the summary lists it: bernoulli_ (a draw, 2 ms), div_, mul (profile op 1);
    // another draw (1 ms) and a draw (0.5 ms) before mm (profile op 0, listed second); a draw
    // (3 ms) before an op the profile does not know (-1), one more (4 ms) after the last op a
    // policy saw. (Note [ A kept draw is no op's recomputation ], op_times.cpp.)
    using recompose::detail::SummaryOp;
    auto handle = [](const char* name, const char* overload) {
      return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    };
    auto entry = [](const c10::OperatorHandle& o, SummaryOp::Kind kind, double draw) {
      SummaryOp e(o, kind);
      e.draw_seconds = draw;
      return e;
    };
    const auto bernoulli = handle("aten::bernoulli_", "float");
    const auto div = handle("aten::div_", "Scalar");
    const auto mul = handle("aten::mul", "Tensor");
    const auto mm = handle("aten::mm", "");
    const auto tanh = handle("aten::tanh", "");
    recompose::detail::ForwardSummary summary;
    summary.ops.push_back(entry(bernoulli, SummaryOp::Kind::Write, 2 * kMs));
    summary.ops.push_back(entry(div, SummaryOp::Kind::Write, 0));
    summary.ops.push_back(entry(mul, SummaryOp::Kind::Decided, 0));
    summary.ops.push_back(entry(bernoulli, SummaryOp::Kind::Write, 1 * kMs));
    summary.ops.push_back(entry(bernoulli, SummaryOp::Kind::Write, 0.5 * kMs));
    summary.ops.push_back(entry(mm, SummaryOp::Kind::Decided, 0));
    summary.ops.push_back(entry(bernoulli, SummaryOp::Kind::Write, 3 * kMs));
    summary.ops.push_back(entry(tanh, SummaryOp::Kind::Decided, 0));
    summary.ops.push_back(entry(bernoulli, SummaryOp::Kind::Write, 4 * kMs));
    const std::vector<int64_t> index_of{-1, -1, 1, -1, -1, 0, -1, -1, -1};

    std::vector<double> draws;
    recompose::detail::add_draws_in_spans(summary, index_of, draws);
    REQUIRE(draws.size() == 2);
    CHECK(draws[0] == doctest::Approx(1.5 * kMs));  // mm's span: the two draws since mul
    CHECK(draws[1] == doctest::Approx(2 * kMs));    // mul's span: the draw before it
    // A module called twice: the second call's draws add to the first's.
    recompose::detail::add_draws_in_spans(summary, index_of, draws);
    CHECK(draws[0] == doctest::Approx(3 * kMs));
    CHECK(draws[1] == doctest::Approx(4 * kMs));
  }
}  // TEST_SUITE
