// The step ledger of a planned step (include/recompose/step_ledger.h, apply_plan): each module the
// plan configures has rows carrying the plan's entry and its estimate of the bytes held, beside
// the measured bytes, which a SavedTensorMeter over the same planned step (no ledger) counts
// independently, block by block.
#include <recompose/hooks/forward_annotation.h>
#include <recompose/memory_plan.h>
#include <recompose/planner.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/step_ledger.h>

#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>  // the planner's JSON library: built with the planner

#include <string>
#include <vector>

namespace {

constexpr int64_t kPlanWidth = 32;

// Products, an MLP and pointwise ops: the planner has choices to make per block.
struct PlanBlockImpl : torch::nn::Module {
  PlanBlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kPlanWidth, 4 * kPlanWidth));
    fc2 = register_module("fc2", torch::nn::Linear(4 * kPlanWidth, kPlanWidth));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    auto att = torch::softmax(torch::matmul(x, x.transpose(-2, -1)) / 4.0, -1);
    auto h = torch::matmul(att, x);
    return x + fc2(torch::gelu(fc1(h)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PlanBlock);

struct PlanNetImpl : torch::nn::Module {
  PlanNetImpl() {
    torch::manual_seed(21);
    for (int i = 0; i < 4; ++i) blocks->push_back(PlanBlock());
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : *blocks) x = b->as<PlanBlockImpl>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(PlanNet);

torch::Tensor plan_input() {
  torch::manual_seed(4);
  return torch::randn({2, 16, kPlanWidth}, torch::requires_grad());
}

recompose::Plan half_plan() {
  PlanNet net;
  const torch::Tensor x = plan_input();
  const auto profile =
      recompose::profile_memory(*net, [&] { net->forward(x).pow(2).mean().backward(); });
  return recompose::solve_plan(profile, recompose::Budget::fraction(0.5));
}

}  // namespace

TEST_SUITE("step ledger: planned steps") {
  TEST_CASE("a planned step: each configured module's row carries the plan's entry and estimate") {
    const recompose::Plan plan = half_plan();
    // The same planned step without a ledger, under one SavedTensorMeter read after each block:
    // what the meter's count grew by in a block is what that block holds first (each storage
    // counted once, in the first block that holds it, as the ledger charges rows).
    std::vector<int64_t> per_block;
    {
      PlanNet net;
      recompose::apply_plan(*net, plan);
      torch::Tensor x = plan_input();
      std::vector<torch::Tensor> keep;  // the graph, held until all blocks are measured
      recompose::SavedTensorMeter meter;
      int64_t before = 0;
      for (auto& b : *net->blocks) {
        x = b->as<PlanBlockImpl>()->forward(x);
        per_block.push_back(meter.bytes_held() - before);
        before = meter.bytes_held();
        keep.push_back(x);
      }
    }

    PlanNet net;
    recompose::apply_plan(*net, plan);
    recompose::StepLedger ledger(*net);
    auto loss = net->forward(plan_input()).pow(2).mean();
    const auto rows = ledger.regions();
    int planned = 0;
    for (std::size_t i = 0; i < plan.modules.size(); ++i) {
      const recompose::ModulePlan& m = plan.modules[i];
      CAPTURE(m.name);
      const std::string row_name = m.name + " (" + m.type + ")";
      const recompose::LedgerRegion* row = nullptr;
      for (const auto& r : rows) {
        if (r.name == row_name) row = &r;
      }
      if (m.choice == recompose::ModuleChoice::None) {
        CHECK(row == nullptr);  // nothing applied: no region, no row
        continue;
      }
      REQUIRE(row != nullptr);
      ++planned;
      CHECK(row->plan_entry.starts_with(std::string(recompose::module_choice_name(m.choice))));
      if (m.choice == recompose::ModuleChoice::Selective) {
        CHECK(row->plan_entry == "selective (keeps " + std::to_string(m.save.size()) +
                                     " op outputs, swaps " + std::to_string(m.swap.size()) + ")");
      }
      CHECK(row->plan_bytes == m.bytes);
      const std::size_t block = std::stoul(m.name.substr(m.name.rfind('.') + 1));
      CHECK(row->bytes_held == per_block.at(block));
      // Held on the device, the planner's estimate is what the step measures.
      if (m.choice == recompose::ModuleChoice::Full ||
          (m.choice == recompose::ModuleChoice::Selective && m.swap.empty()))
        CHECK(row->plan_bytes == row->bytes_held);
    }
    CHECK(planned > 0);
    const std::string text = ledger.str();
    CHECK(text.find("    plan: ") != std::string::npos);
    CHECK(text.find(" held for backward, measured ") != std::string::npos);
    const auto json = nlohmann::json::parse(ledger.json());
    REQUIRE(json["regions"].size() == rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CHECK(json["regions"][i]["plan_entry"] == rows[i].plan_entry);
      CHECK(json["regions"][i]["plan_bytes"] == rows[i].plan_bytes);
    }
    loss.backward();
  }
}
