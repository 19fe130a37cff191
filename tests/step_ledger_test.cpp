// StepLedger (include/recompose/step_ledger.h): every figure of a row checked against an
// independent count: a SavedTensorMeter around the same region invocation (bytes held), the
// selective replay's process-wide counters (replays, ops, fallbacks), and how many regions the
// step ran. Results are bitwise those of the same step without a ledger.
#include "engine/format_bytes.h"
#include "support/grad_check.h"
#include "support/test_modules.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/checkpoint_state.h>
#include <recompose/policy_report.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/step_ledger.h>
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
#include <recompose/selective_checkpoint.h>
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define LEDGER_TEST_JSON 1
#endif

namespace {

using recompose::CheckpointOptions;
using recompose::LedgerRegion;
using recompose::SavedTensorMeter;
using recompose::StepLedger;

// Three tiny blocks in a list: "blocks.0" ... "blocks.2" in the root.
struct LedgerNetImpl : torch::nn::Module {
  LedgerNetImpl() {
    for (int i = 0; i < 3; ++i) blocks->push_back(rt::TinyBlock(8));
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : *blocks) x = b->as<rt::TinyBlockImpl>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(LedgerNet);

LedgerNet make_net(const CheckpointOptions& options) {
  torch::manual_seed(7);
  LedgerNet net;
  for (auto& b : *net->blocks) recompose::apply_checkpoint(*b, options);
  return net;
}

// What a SavedTensorMeter counts for each block's region, invocation by invocation (no ledger).
std::vector<int64_t> meter_per_block(LedgerNet& net, torch::Tensor x) {
  std::vector<int64_t> out;
  std::vector<torch::Tensor> keep;  // the graph, alive while the next block is measured
  for (auto& b : *net->blocks) {
    SavedTensorMeter meter;
    x = b->as<rt::TinyBlockImpl>()->forward(x);
    out.push_back(meter.bytes_held());
    keep.push_back(x);
  }
  return out;
}

// A CPU allocator that raises c10::OutOfMemoryError, as the CUDA caching allocator does, for any
// request of at least `min_bytes` while armed; the rest goes to the allocator it wraps.
class FailingCpuAllocator final : public c10::Allocator {
 public:
  FailingCpuAllocator(c10::Allocator* inner, size_t min_bytes)
      : inner_(inner), min_bytes_(min_bytes) {}
  c10::DataPtr allocate(size_t n) override {
    TORCH_CHECK_WITH(OutOfMemoryError, !(armed && n >= min_bytes_),
                     "test allocator: out of memory, asked for ", n, " bytes");
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  bool armed = false;

 private:
  c10::Allocator* inner_;
  size_t min_bytes_;
};

// Installs `allocator` as the CPU allocator while alive (priority 1, as the GPT example's counter).
struct CpuAllocatorScope {
  explicit CpuAllocatorScope(c10::Allocator* allocator) : previous(c10::GetCPUAllocator()) {
    c10::SetCPUAllocator(allocator, /*priority=*/1);
  }
  ~CpuAllocatorScope() { c10::SetCPUAllocator(previous, /*priority=*/1); }
  c10::Allocator* previous;
};

// A tiny block that asks for a 1 MiB scratch tensor in its forward or in its recomputation.
struct HungryBlockImpl : torch::nn::Module {
  HungryBlockImpl(bool in_forward, bool in_recompute)
      : in_forward(in_forward), in_recompute(in_recompute) {
    fc = register_module("fc", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const bool hungry = recompose::is_recomputing() ? in_recompute : in_forward;
    if (hungry) x = x + torch::zeros({1 << 18}).sum();  // 1 MiB
    return torch::tanh(fc->forward(x));
  }
  bool in_forward, in_recompute;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(HungryBlock);

struct HungryNetImpl : torch::nn::Module {
  // Block `forward_hungry` asks for scratch memory in its forward, `recompute_hungry` in its
  // recomputation (-1: none).
  HungryNetImpl(int forward_hungry, int recompute_hungry) {
    for (int i = 0; i < 3; ++i)
      blocks->push_back(HungryBlock(i == forward_hungry, i == recompute_hungry));
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : *blocks) x = b->as<HungryBlockImpl>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(HungryNet);
}  // namespace

TEST_SUITE("step ledger") {
  TEST_CASE("full regions: names in the root, bytes as a meter counts them, rebuilt by a rerun") {
    LedgerNet net = make_net(CheckpointOptions());
    const auto x = torch::randn({4, 8});
    const std::vector<int64_t> expected = meter_per_block(net, x);
    SavedTensorMeter step_meter;  // the whole step, counted independently
    StepLedger ledger(*net);
    auto loss = net->forward(x).sum();
    const int64_t meter_after_forward = step_meter.bytes_held();
    auto before = ledger.regions();
    REQUIRE(before.size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(before[i].name == "blocks." + std::to_string(i) + " (rt::TinyBlockImpl)");
      CHECK(before[i].mode == recompose::LedgerMode::Full);
      CHECK(before[i].mode_text() == "full");
      CHECK(before[i].inputs == recompose::LedgerInputs::Held);
      CHECK(before[i].depth == 0);
      CHECK(before[i].bytes_held == expected[i]);
      CHECK(before[i].rebuilt() == recompose::LedgerRebuilt::NotRebuiltYet);
    }
    CHECK(expected[0] == 4 * 8 * 4);  // the input x, and nothing else
    CHECK(ledger.bytes_held() == meter_after_forward);
    CHECK(ledger.str().find("not rebuilt yet") != std::string::npos);
    loss.backward();
    for (const auto& r : ledger.regions()) {
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::RanForwardAgain);
      CHECK(r.rebuilds == 1);
      CHECK(r.reruns == 1);
      CHECK(r.replays == 0);
      CHECK(r.host_ns > 0);
    }
    for (auto& b : *net->blocks) CHECK(b->as<rt::TinyBlockImpl>()->body_runs == 3);
  }

  TEST_CASE("nested regions and checkpoint(fn) are rows of their own") {
    torch::manual_seed(3);
    rt::Nested nested;
    recompose::apply_checkpoint(nested);
    recompose::apply_checkpoint(nested->a);
    recompose::apply_checkpoint(nested->b);
    const auto x = torch::randn({2, 4});
    SavedTensorMeter meter;
    StepLedger ledger(*nested);
    auto y = nested->forward(x);
    auto z = recompose::checkpoint([](const torch::Tensor& t) { return t.sin(); }, y);
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 4);
    CHECK(rows[0].name == "rt::NestedImpl");  // the root itself: its type
    CHECK(rows[1].name == "a (rt::TinyBlockImpl)");
    CHECK(rows[2].name == "b (rt::TinyBlockImpl)");
    CHECK(rows[3].name == "checkpoint #1");
    CHECK(rows[1].depth == 1);
    CHECK(rows[2].depth == 1);
    // The inner regions' inputs are the outer region's to recompute: they hold nothing.
    CHECK(rows[1].inputs == recompose::LedgerInputs::EnclosingRegion);
    CHECK(rows[1].bytes_held == 0);
    CHECK(rows[2].bytes_held == 0);
    CHECK(rows[0].bytes_held == x.nbytes());
    CHECK(rows[3].bytes_held == y.nbytes());
    CHECK(ledger.bytes_held() == meter.bytes_held());
    z.sum().backward();
    for (const auto& r : ledger.regions())
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::RanForwardAgain);
  }

  TEST_CASE("checkpoint_sequential: each checkpointed segment is a row naming its modules") {
    torch::manual_seed(5);
    torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 4),
                              torch::nn::Tanh(), torch::nn::Linear(4, 4), torch::nn::Tanh());
    const auto x = torch::randn({3, 4});
    SavedTensorMeter meter;
    StepLedger ledger(*seq);
    auto y = recompose::checkpoint_sequential(seq, 3, x);
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 2);  // every segment but the last
    CHECK(rows[0].name == "checkpoint(0, 1)");
    CHECK(rows[1].name == "checkpoint(2, 3)");
    // The last segment runs plainly: what it saves is the meter's, not a region's.
    int64_t last_segment = 0;
    {
      SavedTensorMeter plain;
      auto h = seq[4]->as<torch::nn::LinearImpl>()->forward(x);
      h = torch::tanh(h);
      last_segment = plain.bytes_held();
    }
    CHECK(ledger.bytes_held() == meter.bytes_held() - last_segment);
    CHECK(rows[0].bytes_held == x.nbytes());
    y.sum().backward();
    for (const auto& r : ledger.regions()) CHECK(r.rebuilds == 1);
  }

  TEST_CASE("a ledger destroyed before backward: rows not rebuilt yet, backward unharmed") {
    LedgerNet net = make_net(CheckpointOptions());
    const auto x = torch::randn({4, 8});
    torch::Tensor loss;
    std::string text;
    {
      StepLedger ledger(*net);
      loss = net->forward(x).sum();
      text = ledger.str();
    }
    CHECK(text.find("3 not rebuilt yet") != std::string::npos);
    loss.backward();  // the frames hold rows of a ledger that is gone
    for (auto& p : net->parameters()) CHECK(p.grad().defined());
  }

  TEST_CASE("a ledger destroyed on another thread stops recording; one ledger per thread") {
    auto ledger = std::make_unique<StepLedger>();
    CHECK_THROWS_AS(StepLedger(), recompose::CheckpointError);
    std::thread([&] { ledger.reset(); }).join();
    LedgerNet net = make_net(CheckpointOptions());
    net->forward(torch::randn({4, 8})).sum().backward();  // nothing records, nothing dangles
    StepLedger again;                                     // this thread may have one again
    net->forward(torch::randn({4, 8})).sum().backward();
    CHECK(again.regions().size() == 3);
  }

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  TEST_CASE("selective regions: kept outputs held, the replay's figures as its counters say") {
    const auto options = CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"}));
    LedgerNet net = make_net(options);
    const auto x = torch::randn({4, 8});
    const std::vector<int64_t> expected = meter_per_block(net, x);
    recompose::reset_selective_replay_stats();
    SavedTensorMeter step_meter;
    StepLedger ledger(*net);
    auto loss = net->forward(x).sum();
    CHECK(ledger.bytes_held() == step_meter.bytes_held());
    auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(rows[i].mode == recompose::LedgerMode::Selective);
      CHECK(rows[i].bytes_held == expected[i]);
    }
    // Each region keeps addmm's output beside its input.
    CHECK(rows[0].bytes_held == x.nbytes() + 4 * 8 * 4);
    loss.backward();
    const auto stats = recompose::selective_replay_stats();
    rows = ledger.regions();
    int64_t replays = 0, ops_run = 0, ops_skipped = 0, substituted = 0, draws = 0;
    for (const auto& r : rows) {
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::Replayed);
      replays += r.replays;
      ops_run += r.ops_run;
      ops_skipped += r.ops_skipped;
      substituted += r.ops_substituted;
      draws += r.draws_written;
    }
    CHECK(replays == stats.replayed);
    CHECK(replays == 3);
    CHECK(ops_run == stats.ops_run);
    CHECK(ops_skipped == stats.ops_skipped);
    CHECK(substituted == stats.ops_substituted);
    CHECK(draws == stats.draws_written);
    CHECK(stats.fallbacks == 0);
  }

  TEST_CASE("a selective region that falls back ran the forward again, with the reason") {
    struct ReplayOff {
      ReplayOff() { recompose::set_selective_replay_enabled(false); }
      ~ReplayOff() { recompose::set_selective_replay_enabled(true); }
    } off;
    const auto options = CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"}));
    LedgerNet net = make_net(options);
    const auto x = torch::randn({4, 8});
    recompose::reset_selective_replay_stats();
    StepLedger ledger(*net);
    net->forward(x).sum().backward();
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.fallbacks == 3);
    for (const auto& r : ledger.regions()) {
      CHECK(r.bytes_held > x.nbytes());  // kept outputs all the same
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::RanForwardAgain);
      CHECK(r.fallback_reason == stats.last_fallback_reason);
      CHECK(r.fallback_reason.find("set_selective_replay_enabled(false)") != std::string::npos);
    }
    CHECK(ledger.str().find("why it ran the forward again: selective replay is off") !=
          std::string::npos);
  }

  TEST_CASE("training with and without a ledger: bitwise the same losses and gradients") {
    auto run = [](bool with_ledger) {
      LedgerNet net = make_net(CheckpointOptions());
      recompose::remove_checkpoint(*(*net->blocks)[1]);
      recompose::apply_checkpoint(
          *(*net->blocks)[1],
          CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"})));
      torch::manual_seed(11);
      const auto x = torch::randn({4, 8});
      std::unique_ptr<StepLedger> ledger;
      if (with_ledger) ledger = std::make_unique<StepLedger>(*net);
      std::vector<torch::Tensor> out;
      for (int step = 0; step < 2; ++step) {
        auto loss = net->forward(x).pow(2).sum();
        loss.backward();
        out.push_back(loss.detach().clone());
        for (auto& p : net->parameters()) {
          out.push_back(p.grad().clone());
          p.mutable_grad() = torch::Tensor();
        }
      }
      return out;
    };
    CHECK(rt::bitwise_equal(run(false), run(true)));
  }
#endif

  TEST_CASE("an out-of-memory error in a region is explained by the ledger, its type unchanged") {
    FailingCpuAllocator failing(c10::GetCPUAllocator(), /*min_bytes=*/1 << 20);
    CpuAllocatorScope installed(&failing);
    REQUIRE(c10::GetCPUAllocator() == &failing);
    auto run = [&](HungryNet& net, const CheckpointOptions& options) {
      for (auto& b : *net->blocks) recompose::apply_checkpoint(*b, options);
      StepLedger ledger(*net);
      std::string message;
      try {
        torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
        torch::Tensor loss = net(x).sum();
        loss.backward();
      } catch (const c10::OutOfMemoryError& e) {  // still the allocator's type
        message = e.what();
      }
      return message;
    };
    SUBCASE("in the forward of the second block, selective") {
      torch::manual_seed(3);
      HungryNet net(/*forward_hungry=*/1, /*recompute_hungry=*/-1);
      failing.armed = true;
      const std::string message =
          run(net, CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"})));
      failing.armed = false;
      CAPTURE(message);
      CHECK(message.find("test allocator: out of memory") != std::string::npos);
      CHECK(message.find("recompose step ledger at this out-of-memory error: in the forward of "
                         "region 2: blocks.1 (") != std::string::npos);
      // A [4, 8] float tensor is 128 B. blocks.0 holds its kept addmm output (its input is a leaf
      // that requires grad: not counted, as SavedTensorMeter does not), blocks.1 its input.
      CHECK(message.find("held for backward by the regions now: 256 B; the most: blocks.0 (") !=
            std::string::npos);
      CHECK(message.find("128 B of op outputs kept by selective regions") != std::string::npos);
      CHECK(message.find("; 128 B of region inputs") != std::string::npos);
      CHECK(message.find("recompose step ledger at") == message.rfind("recompose step ledger at"));
    }
    SUBCASE("in backward, rebuilding the last block") {
      torch::manual_seed(3);
      HungryNet net(/*forward_hungry=*/-1, /*recompute_hungry=*/2);
      failing.armed = true;
      const std::string message = run(net, CheckpointOptions());
      failing.armed = false;
      CAPTURE(message);
      CHECK(message.find("in backward, rebuilding region 3 of 3: blocks.2 (") != std::string::npos);
      CHECK(message.find("(full)") != std::string::npos);
      // The inputs of blocks.1 and blocks.2 (blocks.0's is a leaf that requires grad).
      CHECK(message.find("held for backward by the regions now: 256 B") != std::string::npos);
      CHECK(message.find("could hold less: 256 B of region inputs") != std::string::npos);
    }
    SUBCASE("raised outside any region: the ledger says so when asked") {
      torch::manual_seed(3);
      HungryNet net(-1, -1);
      for (auto& b : *net->blocks) recompose::apply_checkpoint(*b);
      StepLedger ledger(*net);
      torch::Tensor loss = net(torch::randn({4, 8}, torch::requires_grad())).sum();
      const std::string view = ledger.explain_out_of_memory();
      CHECK(view.find("outside any checkpointed region, 3 regions recorded so far") !=
            std::string::npos);
      loss.backward();
    }
  }

  TEST_CASE(
      "a save list's names that no op of a region matched are on its row, as inspect_policy finds "
      "them") {
    // TinyBlock's Linear runs aten::addmm on a 2-d input, never aten::mm or aten::bmm.
    const recompose::SelectivePolicy policy({"aten::addmm", "aten::mm", "aten::bmm.default"});
    torch::manual_seed(7);
    rt::TinyBlock block(8);
    const torch::Tensor x = torch::randn({4, 8});
    const recompose::PolicyReport report = recompose::inspect_policy(policy, block, x);
    recompose::apply_checkpoint(block, CheckpointOptions().policy(policy));
    StepLedger ledger(*block);
    block(x.clone().requires_grad_(true)).sum().backward();
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].unmatched_policy_names ==
          std::vector<std::string>{"aten::mm", "aten::bmm.default"});
    CHECK(rows[0].unmatched_policy_names == report.unmatched_names);  // the same rule
    CHECK(ledger.str().find("names in its policy that no op matched (they kept nothing here): "
                            "aten::mm aten::bmm.default") != std::string::npos);
  }

  TEST_CASE("JSON export: the rows and totals of the table") {
    LedgerNet net = make_net(CheckpointOptions());
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
    // The guide's example (docs/guide/ledger.md): the middle block selective.
    recompose::remove_checkpoint(*(*net->blocks)[1]);
    recompose::apply_checkpoint(
        *(*net->blocks)[1],
        CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"})));
#endif
    StepLedger ledger(*net);
    net->forward(torch::randn({4, 8})).sum().backward();
    const std::string json = ledger.json();
#ifdef LEDGER_TEST_JSON
    const auto parsed = nlohmann::json::parse(json);
    REQUIRE(parsed["regions"].size() == 3);
    CHECK(parsed["regions"][0]["name"] == "blocks.0 (rt::TinyBlockImpl)");
    CHECK(parsed["regions"][2]["rebuilt"] == "ran the forward again");
    CHECK(parsed["totals"]["bytes_held"].get<int64_t>() == ledger.bytes_held());
    CHECK(parsed["totals"]["rebuilds"].get<int64_t>() == 3);
#else
    CHECK(json.find("\"bytes_held\": " + std::to_string(ledger.bytes_held())) != std::string::npos);
#endif
    std::ostringstream text;
    text << ledger;
    MESSAGE("\n" << text.str());
    // The totals line says whose bytes it counts: the rows', not the rest of the step.
    CHECK(text.str().find(
              "total of the 3 rows: " + recompose::detail::format_bytes(ledger.bytes_held()) +
              " held when their forwards ended") != std::string::npos);
  }
}
