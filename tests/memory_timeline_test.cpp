// The CPU counting allocator (include/recompose/cpu_memory_counting.h) and StepLedger's memory
// timeline, on CPU: each figure against an independent count (the tensors the test allocates, the
// allocator's peak over the step, the ledger's rows), the marks' order, the SVG's structure, and
// results bitwise the same with counting on and off.
#include "engine/format_bytes.h"

#include "support/test_modules.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint_options.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/device_memory.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/step_ledger.h>

#include <c10/core/CPUAllocator.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define TIMELINE_TEST_JSON 1
#endif

namespace {

const torch::Device kCpu(torch::kCPU);

// Three checkpointed blocks, 16 -> 16 -> 512 -> 16: the third region's inputs (batch x 512) are
// the most any region holds.
rt::TanhStack make_funnel() {
  torch::manual_seed(3);
  rt::TanhStack net(std::vector<int64_t>{16, 16, 512, 16});
  for (auto& b : *net->blocks) recompose::apply_checkpoint(*b);
  return net;
}

int index_of(const recompose::LedgerTimeline& t, const std::string& kind, int region) {
  for (std::size_t i = 0; i < t.marks.size(); ++i) {
    if (t.marks[i].kind == kind && t.marks[i].region == region) return static_cast<int>(i);
  }
  return -1;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_SUITE("memory timeline") {
  TEST_CASE("counting allocator: off not measured, on counts what the test allocates, restores") {
    c10::Allocator* before = c10::GetCPUAllocator();
    CHECK_FALSE(recompose::cpu_memory_counting());
    CHECK(recompose::peak_device_memory(kCpu) == -1);
    CHECK(recompose::current_device_memory(kCpu) == -1);
    {
      recompose::CpuMemoryCounting counting;
      CHECK(recompose::cpu_memory_counting());
      CHECK(c10::GetCPUAllocator() != before);
      recompose::reset_peak_device_memory(kCpu);
      const int64_t base = recompose::current_device_memory(kCpu);
      CHECK(recompose::peak_device_memory(kCpu) == base);
      {
        recompose::CpuMemoryCounting nested;              // scopes nest: still the same counts
        auto a = torch::empty({1 << 18}, torch::kFloat);  // 1 MiB
        CHECK(recompose::current_device_memory(kCpu) == base + (1 << 20));
        auto b = torch::empty({1 << 17}, torch::kFloat);  // 0.5 MiB
        CHECK(recompose::current_device_memory(kCpu) == base + (3 << 19));
      }
      CHECK(recompose::cpu_memory_counting());
      CHECK(recompose::current_device_memory(kCpu) == base);
      CHECK(recompose::peak_device_memory(kCpu) == base + (3 << 19));
      recompose::reset_peak_device_memory(kCpu);
      CHECK(recompose::peak_device_memory(kCpu) == base);
    }
    CHECK_FALSE(recompose::cpu_memory_counting());
    CHECK(c10::GetCPUAllocator() == before);
    CHECK(recompose::peak_device_memory(kCpu) == -1);
  }

  TEST_CASE("a tensor allocated while counting and freed after is subtracted then") {
    std::optional<recompose::CpuMemoryCounting> counting(std::in_place);
    const int64_t base = recompose::current_device_memory(kCpu);
    auto a = torch::ones({1 << 16});
    counting.reset();
    a = torch::Tensor();  // freed through the wrapper, counting off
    recompose::CpuMemoryCounting again;
    CHECK(recompose::current_device_memory(kCpu) == base);
  }

  TEST_CASE("timeline: peak, boundaries, turn and largest holder against the step") {
    recompose::CpuMemoryCounting counting;
    rt::TanhStack net = make_funnel();
    const auto x = torch::randn({64, 16});
    recompose::StepLedger ledger(*net);
    recompose::reset_peak_device_memory(kCpu);
    auto loss = net->forward(x).square().sum();
    ledger.mark("backward");
    loss.backward();
    const int64_t step_peak = recompose::peak_device_memory(kCpu);
    const recompose::LedgerTimeline t = ledger.timeline();
    const auto regions = ledger.regions();
    REQUIRE(regions.size() == 3);
    REQUIRE(t.measured());
    CHECK(t.source == "CPU counting allocator");
    CHECK(t.device == "cpu");
    // start, four per region, the mark, the read.
    REQUIRE(t.marks.size() == 1 + 4 * 3 + 1 + 1);
    CHECK(t.marks.front().kind == "start");
    CHECK(t.marks.back().kind == "read");

    // The peak is the counting allocator's over the step, and no sample lies above it.
    CHECK(t.peak_bytes == step_peak);
    for (const auto& m : t.marks) CHECK(m.bytes <= t.peak_bytes);
    REQUIRE(t.peak_mark > 0);
    CHECK(t.marks[t.peak_mark].peak == t.peak_bytes);
    CHECK(t.marks[t.peak_mark - 1].peak < t.peak_bytes);

    // Each region's forward leaves its output (and its held inputs) in use; each rebuild leaves
    // the recomputed activations that its backward needs.
    for (int r = 0; r < 3; ++r) {
      const int fb = index_of(t, "forward begin", r), fe = index_of(t, "forward end", r);
      const int rb = index_of(t, "rebuild begin", r), re = index_of(t, "rebuild end", r);
      REQUIRE(fb >= 0);
      REQUIRE(fe > fb);
      REQUIRE(rb >= 0);
      REQUIRE(re > rb);
      CHECK(t.marks[fe].bytes >= t.marks[fb].bytes);
      CHECK(t.marks[re].bytes >= t.marks[rb].bytes);
      // Forwards before the turn, rebuilds after it, in reverse order.
      CHECK(fe < t.turn);
      CHECK(rb > t.turn);
    }
    CHECK(index_of(t, "rebuild begin", 2) < index_of(t, "rebuild begin", 1));
    CHECK(index_of(t, "rebuild begin", 1) < index_of(t, "rebuild begin", 0));
    REQUIRE(t.turn >= 0);
    CHECK(t.marks[t.turn].kind == "mark");
    CHECK(t.marks[t.turn].label == "backward");

    // The region built to hold the most is the largest holder at the peak, with what its row
    // says it held.
    REQUIRE_FALSE(t.holders.empty());
    CHECK(t.holders.front().region == 2);
    CHECK(t.holders.front().name.rfind("blocks.2", 0) == 0);
    CHECK(t.holders.front().bytes == regions[2].bytes_held);
    CHECK(regions[2].bytes_held == 64 * 512 * 4);
    for (std::size_t i = 1; i < t.holders.size(); ++i)
      CHECK(t.holders[i].bytes <= t.holders[i - 1].bytes);

    // At the turn, the rows hold what their rows say (nothing is refunded before backward); the
    // rest of the step is everything else counted: at least the parameters and the net's output,
    // which square() saved for its backward outside the regions.
    int64_t held = 0;
    for (const auto& r : regions) held += r.bytes_held;
    CHECK(t.regions_at_turn == held);
    CHECK(t.regions_at_turn + t.rest_at_turn == t.marks[t.turn].bytes);
    int64_t parameters = 0;
    for (const auto& p : net->parameters()) parameters += static_cast<int64_t>(p.nbytes());
    CHECK(t.rest_at_turn >= parameters + 64 * 16 * 4);

    const std::string text = ledger.str();
    CHECK(text.find("in use at the turn: the regions hold " +
                    recompose::detail::format_bytes(held)) != std::string::npos);
    CHECK(text.find("memory timeline (CPU counting allocator, cpu)") != std::string::npos);
    CHECK(text.find("turn at \"backward\"") != std::string::npos);
    CHECK(text.find("largest holders there: blocks.2") != std::string::npos);
#ifdef TIMELINE_TEST_JSON
    const auto json = nlohmann::json::parse(ledger.json());
    CHECK(json["timeline"]["measured"] == true);
    CHECK(json["timeline"]["peak_bytes"].get<int64_t>() == step_peak);
    CHECK(json["timeline"]["turn"].get<int>() == t.turn);
    CHECK(json["timeline"]["marks"].size() == t.marks.size());
    CHECK(json["timeline"]["holders"][0]["region"] == 2);
    CHECK(json["timeline"]["regions_at_turn"].get<int64_t>() == held);
    CHECK(json["timeline"]["rest_at_turn"].get<int64_t>() == t.rest_at_turn);
    CHECK(json["version"] == 3);
#endif
  }

  TEST_CASE("timeline: without a mark the turn is the first rebuild") {
    recompose::CpuMemoryCounting counting;
    rt::TanhStack net = make_funnel();
    recompose::StepLedger ledger(*net);
    net->forward(torch::randn({8, 16})).sum().backward();
    const auto t = ledger.timeline();
    REQUIRE(t.turn >= 0);
    CHECK(t.marks[t.turn].kind == "rebuild begin");
    CHECK(t.marks[t.turn].region == 2);
    CHECK(t.turn == index_of(t, "forward end", 2) + 1);
  }

  TEST_CASE("timeline SVG: one polyline, every mark labelled, written to a file") {
    recompose::CpuMemoryCounting counting;
    rt::TanhStack net = make_funnel();
    recompose::StepLedger ledger(*net);
    recompose::reset_peak_device_memory(kCpu);
    auto loss = net->forward(torch::randn({16, 16})).sum();
    recompose::ledger_mark("backward");
    loss.backward();
    const std::string path = "memory_timeline_test.svg";
    ledger.write_svg(path);
    std::ifstream in(path);
    std::stringstream read;
    read << in.rdbuf();
    const std::string svg = read.str();
    std::remove(path.c_str());
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    CHECK(svg.size() > 7);
    CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
    CHECK(count_of(svg, "<svg") == 1);
    CHECK(count_of(svg, "</svg>") == 1);
    CHECK(count_of(svg, "<polyline") == 1);
    CHECK(count_of(svg, "<text") == count_of(svg, "</text>"));
    CHECK(svg.find(">backward</text>") != std::string::npos);
    CHECK(svg.find(">peak ") != std::string::npos);
    for (const auto& m : ledger.timeline().marks) {
      const std::string label = m.region < 0 ? m.label : m.label + " " + m.kind;
      CHECK_MESSAGE(svg.find(">" + label + "</text>") != std::string::npos, label);
    }
  }

  TEST_CASE("timeline with counting off: not measured, marks without bytes, nothing fails") {
    REQUIRE_FALSE(recompose::cpu_memory_counting());
    rt::TanhStack net = make_funnel();
    recompose::StepLedger ledger(*net);
    net->forward(torch::randn({8, 16})).sum().backward();
    const auto t = ledger.timeline();
    CHECK_FALSE(t.measured());
    CHECK(t.peak_bytes == -1);
    CHECK(t.peak_mark == -1);
    CHECK(t.holders.empty());
    CHECK(t.marks.size() == 1 + 4 * 3 + 1);
    for (const auto& m : t.marks) CHECK(m.bytes == -1);
    CHECK(t.marks[t.turn].kind == "rebuild begin");
    // What the rows hold at the turn is the ledger's own count, measured or not; the rest of the
    // step needs the allocator's.
    int64_t held = 0;
    for (const auto& r : ledger.regions()) held += r.bytes_held;
    CHECK(held > 0);
    CHECK(t.regions_at_turn == held);
    CHECK(t.rest_at_turn == -1);
    CHECK(ledger.str().find("memory timeline: not measured on cpu") != std::string::npos);
    const std::string svg = ledger.svg();
    CHECK(count_of(svg, "</svg>") == 1);
    CHECK(count_of(svg, "<polyline") == 0);
    CHECK(svg.find("memory not measured") != std::string::npos);
  }

  TEST_CASE("training with the counting allocator on is bitwise training with it off") {
    auto train = [](bool count) {
      std::optional<recompose::CpuMemoryCounting> counting;
      if (count) counting.emplace();
      rt::TanhStack net = make_funnel();
      torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
      torch::manual_seed(11);
      std::vector<torch::Tensor> out;
      for (int step = 0; step < 3; ++step) {
        sgd.zero_grad();
        recompose::StepLedger ledger(*net);
        auto loss = net->forward(torch::randn({32, 16})).square().mean();
        loss.backward();
        out.push_back(loss.detach().clone());
        for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
        sgd.step();
      }
      return out;
    };
    const auto off = train(false), on = train(true);
    REQUIRE(off.size() == on.size());
    for (std::size_t i = 0; i < off.size(); ++i) CHECK(torch::equal(off[i], on[i]));
  }
}
