// StepLedger's Chrome trace (include/recompose/step_ledger.h, chrome_trace and
// write_chrome_trace): the trace parses, has recompose's tracks, and its slices and counters say
// what the ledger's rows, timeline and JSON say (held bytes, the step's peak, the copies swap
// made), on the clock of a profiler trace it joins.
#include "support/test_modules.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/checkpoint_error.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/device_memory.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define CHROME_TRACE_TEST_JSON 1
#endif

#ifdef CHROME_TRACE_TEST_JSON
namespace chrome_trace_test {

using Json = nlohmann::json;

// The events of `trace` with phase `ph` (and name `name`, when given).
std::vector<Json> events_of(const Json& trace, const std::string& ph,
                            const std::string& name = "") {
  std::vector<Json> out;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == ph && (name.empty() || e["name"] == name)) out.push_back(e);
  }
  return out;
}

constexpr const char* kHeld = "recompose: held for backward by the regions";

}  // namespace chrome_trace_test

TEST_SUITE("step ledger: Chrome trace") {
  using namespace chrome_trace_test;

  TEST_CASE("tracks, slices and counters agree with the ledger's rows, timeline and JSON") {
    recompose::CpuMemoryCounting counting;
    torch::manual_seed(5);
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    for (std::size_t i = 0; i < 3; ++i) recompose::apply_checkpoint(net->block(i));
    const auto x = torch::randn({32, 16});
    recompose::StepLedger ledger(*net);
    recompose::reset_peak_device_memory(torch::Device(torch::kCPU));
    auto loss = net->forward(x).square().sum();
    ledger.mark("backward");
    loss.backward();

    const Json trace = Json::parse(ledger.chrome_trace());
    const Json ledger_json = Json::parse(ledger.json());
    const recompose::LedgerTimeline t = ledger.timeline();
    const auto rows = ledger.regions();
    REQUIRE(rows.size() == 3);
    REQUIRE(trace["traceEvents"].is_array());
    CHECK(trace["baseTimeNanoseconds"].get<int64_t>() > 0);

    // The two tracks are named.
    std::vector<std::string> tracks;
    for (const Json& m : events_of(trace, "M", "thread_name")) tracks.push_back(m["args"]["name"]);
    CHECK(std::count(tracks.begin(), tracks.end(), "recompose: regions (forward, rebuild)") == 1);
    CHECK(std::count(tracks.begin(), tracks.end(), "recompose: swap copies") == 1);

    // A forward slice and a rebuild slice per row, named as the row, each with a duration.
    for (const auto& r : rows) {
      int forwards = 0, rebuilds = 0;
      for (const Json& s : events_of(trace, "X", r.name)) {
        CHECK(s["dur"].get<double>() >= 0);
        forwards += s["cat"] == "forward" ? 1 : 0;
        rebuilds += s["cat"] == "rebuild" ? 1 : 0;
      }
      CHECK(forwards == 1);
      CHECK(rebuilds == 1);
    }
    // The mark, once.
    const auto marks = events_of(trace, "i", "backward");
    REQUIRE(marks.size() == 1);

    // Held bytes: at the mark (the turn), the rows' bytes, as the timeline and the JSON say.
    double held_at_mark = -1;
    int64_t held_max = 0;
    for (const Json& c : events_of(trace, "C", kHeld)) {
      held_max = std::max(held_max, c["args"]["bytes"].get<int64_t>());
      if (c["ts"] == marks[0]["ts"]) held_at_mark = c["args"]["bytes"].get<double>();
    }
    CHECK(held_at_mark == doctest::Approx(static_cast<double>(t.regions_at_turn)));
    CHECK(held_max == ledger_json["totals"]["bytes_held"].get<int64_t>());
    CHECK(ledger_json["timeline"]["regions_at_turn"].get<int64_t>() == t.regions_at_turn);

    // The step's peak: the last "peak since reset" reading, as the timeline's and the JSON's.
    const auto memory = events_of(trace, "C", "recompose: device memory");
    REQUIRE(memory.size() == t.marks.size() - 1);  // every sample but the timeline's read
    // (The last by time, not the largest: the ledger's first sample precedes the test's
    // reset_peak_device_memory, so it reads whatever peak earlier tests left.)
    const Json* last = &memory.front();
    for (const Json& c : memory) {
      if (c["ts"].get<double>() >= (*last)["ts"].get<double>()) last = &c;
    }
    const int64_t peak = (*last)["args"]["peak since reset"].get<int64_t>();
    CHECK(peak == t.peak_bytes);
    CHECK(peak == ledger_json["timeline"]["peak_bytes"].get<int64_t>());
    CHECK(events_of(trace, "X").size() == 6);  // no copies: nothing was offloaded
  }

  TEST_CASE("swap copies: a slice per copy landed, counters back to zero in flight") {
    torch::manual_seed(6);
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    for (std::size_t i = 0; i < 3; ++i) {
      recompose::apply_offload(net->block(i), recompose::OffloadOptions().manager(manager));
    }
    recompose::StepLedger ledger(*net);
    net->forward(torch::randn({32, 16}, torch::requires_grad())).sum().backward();
    const auto rows = ledger.regions();
    const Json trace = Json::parse(ledger.chrome_trace());
    int64_t offloaded = 0, reloaded = 0, bytes_to_host = 0, bytes_back = 0;
    for (const auto& r : rows) {
      offloaded += r.swap.tensors_offloaded;
      reloaded += r.swap.tensors_reloaded;
      bytes_to_host += r.swap.bytes_to_host_landed;
      bytes_back += r.swap.bytes_to_device_landed;
    }
    REQUIRE(offloaded > 0);
    int64_t slices_to_host = 0, slices_back = 0, slice_bytes_to_host = 0, slice_bytes_back = 0;
    for (const Json& s : events_of(trace, "X")) {
      if (s["cat"] != "copy") continue;
      const std::string name = s["name"];
      const bool to_host = name.rfind("to host: ", 0) == 0;
      (to_host ? slices_to_host : slices_back) += 1;
      (to_host ? slice_bytes_to_host : slice_bytes_back) += s["args"]["bytes"].get<int64_t>();
    }
    // CPU copies are synchronous: each landed, and the trace has each, with the ledger's bytes.
    CHECK(slices_to_host == offloaded);
    CHECK(slices_back == reloaded);
    CHECK(slice_bytes_to_host == bytes_to_host);
    CHECK(slice_bytes_back == bytes_back);
    const auto swap = events_of(trace, "C", "recompose: swap");
    REQUIRE_FALSE(swap.empty());
    CHECK(swap.back()["args"]["in flight"] == 0);
    CHECK(swap.back()["args"]["on host"] == 0);  // everything came back
  }

  TEST_CASE("joined to a profiler's trace: its events kept, the ledger's on its clock") {
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    recompose::apply_checkpoint(net->block(1));
    recompose::StepLedger ledger(*net);
    net->forward(torch::randn({4, 16})).sum().backward();
    const Json alone = Json::parse(ledger.chrome_trace());
    const int64_t base = alone["baseTimeNanoseconds"].get<int64_t>() - 5'000'000'000;  // 5 s before
    const std::string path = "ledger_chrome_trace_test.json";
    {
      Json profiler = {{"schemaVersion", 1},
                       {"baseTimeNanoseconds", base},
                       {"traceEvents", Json::array({{{"name", "aten::mm"},
                                                     {"ph", "X"},
                                                     {"pid", 1},
                                                     {"tid", 1},
                                                     {"ts", 10.0},
                                                     {"dur", 2.0}}})}};
      std::ofstream(path) << profiler.dump();
    }
    ledger.write_chrome_trace(path, path);
    Json joined;
    std::ifstream(path) >> joined;
    CHECK(joined["schemaVersion"] == 1);
    CHECK(joined["baseTimeNanoseconds"].get<int64_t>() == base);
    REQUIRE(events_of(joined, "X", "aten::mm").size() == 1);
    // Every event of the ledger's, 5 s (5e6 us) later on the profiler's clock.
    const auto held_alone = events_of(alone, "C", kHeld);
    const auto held_joined = events_of(joined, "C", kHeld);
    REQUIRE(held_alone.size() == held_joined.size());
    REQUIRE_FALSE(held_alone.empty());
    for (std::size_t i = 0; i < held_alone.size(); ++i) {
      CHECK(held_joined[i]["ts"].get<double>() ==
            doctest::Approx(held_alone[i]["ts"].get<double>() + 5e6).epsilon(1e-12));
    }
    CHECK(joined["traceEvents"].size() == alone["traceEvents"].size() + 1);

    // A file that is no Chrome trace is refused, naming it.
    std::ofstream(path) << "[1, 2, 3]";
    CHECK_THROWS_WITH_AS(ledger.write_chrome_trace(path, path),
                         doctest::Contains("is not a Chrome trace"), recompose::CheckpointError);
    CHECK_THROWS_AS(ledger.write_chrome_trace(path, "no/such/trace.json"),
                    recompose::CheckpointError);
    std::remove(path.c_str());
  }
}
#endif
