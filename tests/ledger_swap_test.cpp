// The step ledger's swap and offload figures (include/recompose/step_ledger.h), each checked
// against an independent count: the manager's SwapStats over the step, offload_stats of each
// module, and a SavedTensorMeter around a plain step of the same module. CPU only: copies are
// synchronous there, so every copy has landed when it returns.
#include "support/grad_check.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/checkpoint.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
#include <recompose/selective_checkpoint.h>
#endif

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define LEDGER_SWAP_TEST_JSON 1
#endif

namespace {

using recompose::LedgerRegion;
using recompose::OffloadOptions;
using recompose::SavedTensorMeter;
using recompose::StepLedger;
using recompose::SwapManager;
using recompose::SwapOptions;
using recompose::SwapStats;

constexpr int64_t kWidth = 16;
constexpr int64_t kBatch = 8;

// Saves, per call: fc's input (x * 2), fc's weight (a parameter), tanh's and sigmoid's outputs,
// and both again for the product: six saved tensors on three activation storages.
struct SwapBlockImpl : torch::nn::Module {
  SwapBlockImpl() { fc = register_module("fc", torch::nn::Linear(kWidth, kWidth)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const torch::Tensor h = fc->forward(x * 2);
    return torch::tanh(h) * torch::sigmoid(h);
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SwapBlock);

struct SwapNetImpl : torch::nn::Module {
  SwapNetImpl() {
    torch::manual_seed(3);
    for (int i = 0; i < 3; ++i) blocks->push_back(SwapBlock());
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : *blocks) x = b->as<SwapBlockImpl>()->forward(x);
    return x;
  }
  SwapBlockImpl& block(std::size_t i) { return *(*blocks)[i]->as<SwapBlockImpl>(); }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(SwapNet);

// Requiring grad, each block saves fc's weight too (addmm keeps mat2 for its input's gradient).
torch::Tensor input(bool requires_grad = true) {
  torch::manual_seed(11);
  return torch::randn({kBatch, kWidth}, torch::requires_grad(requires_grad));
}

// A SavedTensorMeter around each block of a plain step (no offload, no ledger).
struct PlainCount {
  int64_t bytes = 0;
  int64_t tensors = 0;
};
std::vector<PlainCount> plain_per_block() {
  SwapNet net;
  torch::Tensor x = input();
  std::vector<PlainCount> out;
  std::vector<torch::Tensor> keep;  // each block's graph, alive while the next is measured
  for (std::size_t i = 0; i < 3; ++i) {
    SavedTensorMeter meter;
    x = net->block(i).forward(x);
    out.push_back({meter.bytes_held(), meter.tensors_held()});
    keep.push_back(x);
  }
  return out;
}

const recompose::LedgerKept* kept_for(const LedgerRegion& r, const std::string& reason) {
  for (const auto& k : r.kept) {
    if (k.reason == reason) return &k;
  }
  return nullptr;
}

SwapStats minus(const SwapStats& a, const SwapStats& b) {
  SwapStats d;
  d.tensors_offloaded = a.tensors_offloaded - b.tensors_offloaded;
  d.bytes_offloaded = a.bytes_offloaded - b.bytes_offloaded;
  d.tensors_reloaded = a.tensors_reloaded - b.tensors_reloaded;
  d.bytes_reloaded = a.bytes_reloaded - b.bytes_reloaded;
  d.prefetched = a.prefetched - b.prefetched;
  d.sync_loads = a.sync_loads - b.sync_loads;
  d.late_reloads = a.late_reloads - b.late_reloads;
  return d;
}

// The sum of the rows' swap figures, as SwapStats names them.
SwapStats rows_total(const std::vector<LedgerRegion>& rows) {
  SwapStats t;
  for (const auto& r : rows) {
    t.tensors_offloaded += r.swap.tensors_offloaded;
    t.bytes_offloaded += r.swap.bytes_offloaded;
    t.tensors_reloaded += r.swap.tensors_reloaded;
    t.bytes_reloaded += r.swap.bytes_reloaded;
    t.prefetched += r.swap.prefetched;
    t.sync_loads += r.swap.sync_loads;
    t.late_reloads += r.swap.late_reloads;
  }
  return t;
}

void check_same(const SwapStats& rows, const SwapStats& stats) {
  CHECK(rows.tensors_offloaded == stats.tensors_offloaded);
  CHECK(rows.bytes_offloaded == stats.bytes_offloaded);
  CHECK(rows.tensors_reloaded == stats.tensors_reloaded);
  CHECK(rows.bytes_reloaded == stats.bytes_reloaded);
  CHECK(rows.prefetched == stats.prefetched);
  CHECK(rows.sync_loads == stats.sync_loads);
  CHECK(rows.late_reloads == stats.late_reloads);
}

}  // namespace

TEST_SUITE("step ledger: swap and offload") {
  TEST_CASE(
      "a filter is asked once per saved tensor, and what it refused is kept for that reason") {
    // A filter with state (it accepts every other tensor it is asked about): asking it again for
    // the ledger's reason would change its answers, and could find no reason at all.
    SwapNet net;
    int64_t asked = 0;
    auto manager = SwapManager::create(SwapOptions().min_bytes(0).filter(
        [&asked](const at::Tensor&) { return asked++ % 2 == 0; }));
    for (auto& b : *net->blocks) recompose::apply_offload(*b, OffloadOptions().manager(manager));
    StepLedger ledger(*net);
    auto loss = net->forward(input()).sum();
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    int64_t refused = 0, parameters = 0;
    for (const LedgerRegion& r : rows) {
      if (const auto* k = kept_for(r, "rejected by the filter")) refused += k->tensors;
      if (const auto* k = kept_for(r, "parameter")) parameters += k->tensors;
    }
    // Six saves per block, one a parameter (never shown to the filter): 15 asked, 7 refused.
    CHECK(parameters == 3);
    CHECK(asked == 15);
    CHECK(refused == asked / 2);
    loss.backward();
  }

  TEST_CASE("apply_offload under min_bytes: a row per call, every tensor kept below min_bytes") {
    // The case: activations under the default 1 MiB threshold never move. The ledger says
    // so on each row, and counts them as held, as a meter of the plain step does.
    const std::vector<PlainCount> plain = plain_per_block();
    SwapNet net;
    auto manager = SwapManager::create(SwapOptions().min_bytes(int64_t{1} << 20));
    for (auto& b : *net->blocks) recompose::apply_offload(*b, OffloadOptions().manager(manager));
    StepLedger ledger(*net);
    auto loss = net->forward(input()).sum();
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      const LedgerRegion& r = rows[i];
      CAPTURE(i);
      CHECK(r.name.starts_with("blocks." + std::to_string(i) + " ("));
      CHECK(r.name.ends_with("SwapBlockImpl)"));
      CHECK(r.mode == recompose::LedgerMode::Offload);
      CHECK(r.mode_text() == "offload");
      CHECK_FALSE(r.checkpointed);
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::NotCheckpointed);
      CHECK(r.bytes_held == plain[i].bytes);
      CHECK(r.swap.tensors_offloaded == 0);
      const recompose::LedgerKept* below = kept_for(r, "below min_bytes");
      REQUIRE(below != nullptr);
      CHECK(below->tensors == plain[i].tensors);  // every saved activation
      const recompose::LedgerKept* parameter = kept_for(r, "parameter");
      REQUIRE(parameter != nullptr);
      CHECK(r.kept.size() == 2);
      const recompose::OffloadStats stats = recompose::offload_stats(net->block(i));
      CHECK(stats.tensors_offloaded == 0);
      CHECK(r.tensors_kept() == stats.tensors_kept);
      CHECK(r.bytes_kept() == stats.bytes_kept);
      CHECK(parameter->tensors == stats.tensors_kept - plain[i].tensors);
    }
    CHECK(plain[0].tensors == 5);  // the block as its comment says: six saves, one a parameter
    const std::string text = ledger.str();
    CHECK(text.find("0 checkpointed regions, 3 offloaded calls (apply_offload only)") !=
          std::string::npos);
    CHECK(text.find("kept on the device: 6 tensors") != std::string::npos);
    CHECK(text.find("5 below min_bytes") != std::string::npos);
    loss.backward();
    for (const auto& r : ledger.regions()) CHECK(r.swap.tensors_reloaded == 0);
  }

  TEST_CASE("apply_offload moving tensors: per row as offload_stats and the manager count") {
    const std::vector<PlainCount> plain = plain_per_block();
    SwapNet net;
    auto manager = SwapManager::create(SwapOptions().min_bytes(0));
    for (auto& b : *net->blocks) recompose::apply_offload(*b, OffloadOptions().manager(manager));
    const SwapStats before = manager->stats();
    StepLedger ledger(*net);
    // Block by block, with the manager's count of each call: a call launches the copies of the
    // previous call's tensors as it begins (keep_last_on_device).
    std::vector<SwapStats> during;
    torch::Tensor x = input();
    for (std::size_t i = 0; i < 3; ++i) {
      const SwapStats start = manager->stats();
      x = net->block(i).forward(x);
      during.push_back(minus(manager->stats(), start));
    }
    auto loss = x.sum();
    // Held when each call ended, as a meter of the plain step counts: nothing had left yet.
    auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(rows[i].bytes_held == plain[i].bytes);
    loss.backward();
    rows = ledger.regions();
    const SwapStats step = minus(manager->stats(), before);
    check_same(rows_total(rows), step);
    int64_t saves_offloaded = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const LedgerRegion& r = rows[i];
      CAPTURE(i);
      if (i < 2) {
        CHECK(r.swap.tensors_offloaded == during[i + 1].tensors_offloaded);
        CHECK(r.swap.bytes_offloaded == during[i + 1].bytes_offloaded);
      }
      const recompose::OffloadStats stats = recompose::offload_stats(net->block(i));
      saves_offloaded += stats.tensors_offloaded;
      // CPU copies are synchronous: every copy landed, with its host time measured.
      CHECK(r.swap.bytes_to_host_landed == r.swap.bytes_offloaded);
      CHECK(r.swap.bytes_to_device_landed == r.swap.bytes_reloaded);
      CHECK(r.swap.tensors_reloaded == r.swap.tensors_offloaded);
      if (r.swap.bytes_offloaded != 0) {
        CHECK(r.swap.to_host_ns > 0);
        CHECK(r.swap.to_host_gb_per_s() > 0);
      }
      const recompose::LedgerKept* asked = kept_for(r, "asked for before it left");
      CHECK((asked ? asked->tensors : 0) == stats.tensors_left_on_device);
      CHECK((asked ? asked->bytes : 0) == stats.bytes_left_on_device);
      const recompose::LedgerKept* parameter = kept_for(r, "parameter");
      REQUIRE(parameter != nullptr);
      CHECK(parameter->tensors == stats.tensors_kept);  // min_bytes 0: only the weight stays
      CHECK(r.swap.reload_stalled() == (r.swap.sync_loads + r.swap.late_reloads > 0));
    }
    // A save of a tensor already offloaded shares its copy: offload_stats counts saves.
    CHECK(step.tensors_offloaded + (manager->stats().shared_offloads - before.shared_offloads) ==
          saves_offloaded);
    CHECK(rows[0].swap.tensors_offloaded == 3);  // the block's three activation storages
    CHECK(rows[2].swap.tensors_offloaded == 0);  // the last call's tensors never left
    CHECK(ledger.str().find("moved: " + std::to_string(rows[0].swap.tensors_offloaded) +
                            " tensors") != std::string::npos);
  }

  TEST_CASE("apply_offload: bitwise the same gradients with and without a ledger") {
    auto run = [](bool with_ledger) {
      SwapNet net;
      auto manager = SwapManager::create(SwapOptions().min_bytes(0));
      for (auto& b : *net->blocks) recompose::apply_offload(*b, OffloadOptions().manager(manager));
      std::unique_ptr<StepLedger> ledger;
      if (with_ledger) ledger = std::make_unique<StepLedger>(*net);
      const torch::Tensor x = input();
      return rt::grads_of([&] { return net->forward(x).sum(); }, net->parameters());
    };
    CHECK(rt::bitwise_equal(run(false), run(true)));
  }

  TEST_CASE("apply_offload and apply_checkpoint on one module: one row, the inputs offloaded") {
    SwapNet net;
    auto manager = SwapManager::create(SwapOptions().min_bytes(0));
    for (auto& b : *net->blocks) {
      recompose::apply_checkpoint(*b);
      recompose::apply_offload(*b, OffloadOptions().manager(manager));
    }
    const SwapStats before = manager->stats();
    StepLedger ledger(*net);
    net->forward(input(/*requires_grad=*/false)).sum().backward();  // block 0's input moves
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    check_same(rows_total(rows), minus(manager->stats(), before));
    for (std::size_t i = 0; i < 3; ++i) {
      const LedgerRegion& r = rows[i];
      CAPTURE(i);
      CHECK(r.mode == recompose::LedgerMode::Full);
      CHECK(r.offloaded);
      CHECK_FALSE(r.swap_inputs);
      CHECK(r.mode_text() == "full + offload");
      CHECK(r.checkpointed);
      CHECK(r.depth == 0);
      CHECK(r.rebuilt() == recompose::LedgerRebuilt::RanForwardAgain);
      const recompose::OffloadStats stats = recompose::offload_stats(net->block(i));
      CHECK(r.swap.tensors_offloaded == stats.tensors_offloaded);
      CHECK(r.swap.bytes_offloaded == stats.bytes_offloaded);
    }
    CHECK(rows[0].swap.tensors_offloaded == 1);  // the region keeps only its input
  }

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  TEST_CASE("MUST_SWAP and swap_inputs regions: bytes moved as the manager's stats count them") {
    auto manager = SwapManager::create(SwapOptions().min_bytes(0));
    auto options = recompose::CheckpointOptions().swap_manager(manager);
    options.policy(
        recompose::SelectivePolicy([](const recompose::SelectiveCheckpointContext&,
                                      const c10::OperatorHandle& op, const torch::jit::Stack&) {
          return op.schema().name() == "aten::mm" ? recompose::CheckpointPolicy::MUST_SWAP
                                                  : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
        }));
    auto inputs_swapped = recompose::CheckpointOptions().swap_inputs(true).swap_manager(manager);
    torch::manual_seed(5);
    auto a = torch::randn({4, 6}, torch::requires_grad());
    auto b = torch::randn({6, 5}, torch::requires_grad());
    auto body = [](const torch::Tensor& h, const torch::Tensor& w) {
      return torch::mm(torch::mm(h, w).sin(), w.t()).tanh();
    };
    const SwapStats before = manager->stats();
    StepLedger ledger;
    const torch::Tensor y = recompose::checkpoint(options, body, a, b);
    const SwapStats after_first = manager->stats();
    const torch::Tensor z = recompose::checkpoint(inputs_swapped, body, (y * 3).contiguous(), b);
    const SwapStats after_forward = manager->stats();
    auto rows = ledger.regions();
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].mode == recompose::LedgerMode::Selective);
    CHECK(rows[0].swap.tensors_offloaded == minus(after_first, before).tensors_offloaded);
    CHECK(rows[0].swap.bytes_offloaded == minus(after_first, before).bytes_offloaded);
    CHECK(rows[0].swap.tensors_offloaded == 2);  // the two mm outputs
    CHECK(rows[1].mode == recompose::LedgerMode::Full);
    CHECK(rows[1].swap_inputs);
    CHECK(rows[1].mode_text() == "full + swap inputs");
    CHECK(rows[1].swap.bytes_offloaded == minus(after_forward, after_first).bytes_offloaded);
    CHECK(rows[1].swap.bytes_offloaded == 4 * 6 * 4);  // y * 3; b is a leaf that requires grad
    const recompose::LedgerKept* parameter = kept_for(rows[1], "parameter");
    REQUIRE(parameter != nullptr);
    CHECK(parameter->tensors == 1);
    CHECK(parameter->bytes == 6 * 5 * 4);
    z.sum().backward();
    rows = ledger.regions();
    check_same(rows_total(rows), minus(manager->stats(), before));
    CHECK(rows[0].swap.bytes_reloaded == rows[0].swap.bytes_offloaded);
    CHECK(rows[0].swap.bytes_to_device_landed == rows[0].swap.bytes_reloaded);
  }
#endif  // RECOMPOSE_TEST_NO_SELECTIVE

#ifdef LEDGER_SWAP_TEST_JSON
  TEST_CASE("JSON export: the swap fields and kept reasons of each row") {
    SwapNet net;
    auto manager = SwapManager::create(SwapOptions().min_bytes(0));
    for (auto& b : *net->blocks) recompose::apply_offload(*b, OffloadOptions().manager(manager));
    StepLedger ledger(*net);
    net->forward(input()).sum().backward();
    const auto rows = ledger.regions();
    const auto json = nlohmann::json::parse(ledger.json());
    REQUIRE(json["regions"].size() == rows.size());
    int64_t offloaded = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& j = json["regions"][i];
      CHECK(j["checkpointed"] == rows[i].checkpointed);
      // Version 3: the mode alone, its flags beside it (apply_offload only: "offload").
      CHECK(j["mode"] == "offload");
      CHECK(j["swap_inputs"] == false);
      CHECK(j["offloaded"] == false);
      CHECK(j["inputs"] == "-");
      CHECK(j["rebuilt"] == "not checkpointed");
      CHECK(j["swap"]["tensors_offloaded"] == rows[i].swap.tensors_offloaded);
      CHECK(j["swap"]["bytes_offloaded"] == rows[i].swap.bytes_offloaded);
      CHECK(j["swap"]["tensors_reloaded"] == rows[i].swap.tensors_reloaded);
      CHECK(j["swap"]["bytes_reloaded"] == rows[i].swap.bytes_reloaded);
      CHECK(j["swap"]["sync_loads"] == rows[i].swap.sync_loads);
      CHECK(j["swap"]["reload_stalled"] == rows[i].swap.reload_stalled());
      CHECK(j["swap"]["bytes_to_host_landed"] == rows[i].swap.bytes_to_host_landed);
      REQUIRE(j["kept"].size() == rows[i].kept.size());
      for (std::size_t k = 0; k < rows[i].kept.size(); ++k) {
        CHECK(j["kept"][k]["reason"] == rows[i].kept[k].reason);
        CHECK(j["kept"][k]["tensors"] == rows[i].kept[k].tensors);
        CHECK(j["kept"][k]["bytes"] == rows[i].kept[k].bytes);
      }
      offloaded += rows[i].swap.bytes_offloaded;
    }
    CHECK(json["totals"]["swap"]["bytes_offloaded"] == offloaded);
    CHECK(json["totals"]["offload_only"] == 3);
  }
#endif
}
