// The memory_viz snapshot (include/recompose/memory_snapshot.h) on CPU: the counting allocator's
// trace in the format memory_viz reads, checked against independent counts (the allocator's
// current and peak, the ledger's held bytes), the three artifacts (the ledger's JSON, its Chrome
// trace and the snapshot) agreeing on held bytes and the step's peak, recompose's decisions as
// the entries' user metadata and categories, Python's pickle loading it, and misuse refused.
#include "support/test_modules.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/checkpoint_error.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/device_memory.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/memory_snapshot.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
#include <recompose/selective_checkpoint.h>
#endif

#include <doctest/doctest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define MEMORY_SNAPSHOT_TEST_JSON 1
#endif

namespace memory_snapshot_test {

using c10::IValue;

// The snapshot, unpickled by LibTorch's unpickler.
c10::Dict<IValue, IValue> unpickled(const std::string& bytes) {
  return torch::jit::unpickle(bytes.data(), bytes.size()).toGenericDict();
}

std::string str(const c10::Dict<IValue, IValue>& d, const char* key) {
  return d.at(key).toStringRef();
}
int64_t num(const c10::Dict<IValue, IValue>& d, const char* key) { return d.at(key).toInt(); }

std::vector<c10::Dict<IValue, IValue>> trace_of(const c10::Dict<IValue, IValue>& snapshot) {
  std::vector<c10::Dict<IValue, IValue>> out;
  const auto traces = snapshot.at("device_traces").toList();
  REQUIRE(traces.size() == 1);
  for (const IValue& e : traces.get(0).toList()) out.push_back(e.toGenericDict());
  return out;
}

// What the snapshot says, computed as memory_viz's timeline does: the allocations alive at the
// dump (its segments), the step's peak (the bytes alive at the trace's start, live at the dump
// minus what the trace added, then each alloc and completed free in turn), and the bytes of the
// allocations held for backward.
struct SnapshotFigures {
  int64_t live = 0;
  int64_t peak = 0;
  int64_t held = 0;
  std::set<std::string> categories;
};

SnapshotFigures figures_of(const c10::Dict<IValue, IValue>& snapshot) {
  SnapshotFigures f;
  for (const IValue& s : snapshot.at("segments").toList())
    f.live += num(s.toGenericDict(), "total_size");
  const auto trace = trace_of(snapshot);
  int64_t added = 0, level = 0, most = 0;
  for (const auto& e : trace) {
    const std::string action = str(e, "action");
    f.categories.insert(str(e, "category"));
    if (action == "alloc") {
      level += num(e, "size");
      if (str(e, "category") == "held for backward") f.held += num(e, "size");
    }
    if (action == "free_completed") level -= num(e, "size");
    most = std::max(most, level);
  }
  added = level;
  f.peak = f.live - added + most;
  return f;
}

// The user metadata of the trace's alloc entries.
std::vector<std::string> alloc_metadata(const c10::Dict<IValue, IValue>& snapshot) {
  std::vector<std::string> out;
  for (const auto& e : trace_of(snapshot)) {
    if (str(e, "action") == "alloc") out.push_back(str(e, "user_metadata"));
  }
  return out;
}

bool any_starts_with(const std::vector<std::string>& texts, const std::string& prefix) {
  return std::any_of(texts.begin(), texts.end(),
                     [&](const std::string& t) { return t.rfind(prefix, 0) == 0; });
}

// A Python with pickle: the peer's virtual environment (scripts/setup-python-peer.sh) if there,
// else python3 on PATH; "" when neither runs.
std::string python_with_pickle() {
  const char* deps = std::getenv("RECOMPOSE_DEPS");
  const char* home = std::getenv("HOME");
  std::vector<std::string> candidates;
  if (const char* venv = std::getenv("RECOMPOSE_PY_PEER"))
    candidates.push_back(venv + std::string("/bin/python"));
  if (deps != nullptr) candidates.push_back(deps + std::string("/py-torch-2.11/bin/python"));
  if (home != nullptr)
    candidates.push_back(home + std::string("/.cache/recompose/py-torch-2.11/bin/python"));
  candidates.emplace_back("python3");
  for (const auto& python : candidates) {
    const std::string probe = "'" + python + "' -c 'import pickle' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

std::string run_command(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  pclose(pipe);
  return out;
}

// Stops any recording and forgets its history.
void forget_history() {
  recompose::record_memory_history(false, recompose::MemoryHistoryOptions().clear_history(true));
}

}  // namespace memory_snapshot_test

TEST_SUITE("memory_viz snapshot") {
  using namespace memory_snapshot_test;

  TEST_CASE("misuse: dump without a recording, unwritable path, no counting, twice on") {
    forget_history();
    CHECK_THROWS_WITH_AS(recompose::dump_memory_snapshot("never.pickle"),
                         doctest::Contains("no memory history was recorded"),
                         recompose::CheckpointError);
    CHECK_THROWS_WITH_AS(recompose::memory_snapshot(),
                         doctest::Contains("record_memory_history(true)"),
                         recompose::CheckpointError);
    if (!recompose::cpu_memory_counting()) {
      CHECK_THROWS_WITH_AS(recompose::record_memory_history(true),
                           doctest::Contains("CpuMemoryCounting"), recompose::CheckpointError);
    }
    recompose::CpuMemoryCounting counting;
    CHECK_THROWS_WITH_AS(
        recompose::record_memory_history(true, recompose::MemoryHistoryOptions().max_entries(0)),
        doctest::Contains("max_entries must be positive"), recompose::CheckpointError);
    CHECK_THROWS_WITH_AS(recompose::record_memory_history(
                             true, recompose::MemoryHistoryOptions().device(c10::Device("meta"))),
                         doctest::Contains("cannot record the memory of meta"),
                         recompose::CheckpointError);
    CHECK_FALSE(recompose::recording_memory_history());
    recompose::record_memory_history(true);
    CHECK(recompose::recording_memory_history());
    CHECK_THROWS_WITH_AS(recompose::record_memory_history(true),
                         doctest::Contains("a recording is on already"),
                         recompose::CheckpointError);
    recompose::record_memory_history(false);
    CHECK_FALSE(recompose::recording_memory_history());
    CHECK_THROWS_WITH_AS(recompose::dump_memory_snapshot("/no/such/folder/snapshot.pickle"),
                         doctest::Contains("cannot write /no/such/folder/snapshot.pickle"),
                         recompose::CheckpointError);
    forget_history();
  }

  TEST_CASE("the trace agrees with the counting allocator, and with the ledger and its trace") {
    recompose::CpuMemoryCounting counting;
    torch::manual_seed(5);
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    for (std::size_t i = 0; i < 3; ++i) recompose::apply_checkpoint(net->block(i));
    recompose::record_memory_history(true);
    const auto x = torch::randn({32, 16});
    recompose::StepLedger ledger(*net);
    recompose::reset_peak_device_memory(torch::kCPU);
    auto loss = net->forward(x).square().sum();
    ledger.mark("backward");
    loss.backward();
    loss = torch::Tensor();
    const std::string bytes = recompose::memory_snapshot();
    const int64_t current = recompose::current_device_memory(torch::kCPU);
    const int64_t peak = recompose::peak_device_memory(torch::kCPU);
    recompose::record_memory_history(false);
    const auto snapshot = unpickled(bytes);
    const SnapshotFigures f = figures_of(snapshot);

    // The independent count: the counting allocator's current and peak.
    CHECK(f.live == current);
    CHECK(f.peak == peak);
    // Its decisions: a forward and a rerun (full regions) per region, and held bytes.
    const auto metadata = alloc_metadata(snapshot);
    for (const char* k : {"#1", "#2", "#3"}) {
      CHECK(any_starts_with(metadata, std::string("forward: ") + k + " "));
      CHECK(any_starts_with(metadata, std::string("rerun: ") + k + " "));
    }
    for (const char* c : {"forward", "rerun", "held for backward", "unknown"})
      CHECK(f.categories.count(c) == 1);
    CHECK(f.held == ledger.bytes_held());
    CHECK(std::any_of(metadata.begin(), metadata.end(), [](const std::string& m) {
      return m.find("held for backward by #1 ") != std::string::npos;
    }));

#ifdef MEMORY_SNAPSHOT_TEST_JSON
    // The three artifacts: held bytes and the step's peak within 1%.
    using Json = nlohmann::json;
    const Json ledger_json = Json::parse(ledger.json());
    const Json trace = Json::parse(ledger.chrome_trace());
    // The trace's peak: its last "peak since reset" reading (the ledger's first sample precedes
    // reset_peak_device_memory, so it reads whatever peak earlier tests left).
    int64_t trace_held = 0, trace_peak = 0;
    double last_ts = -1;
    for (const Json& e : trace["traceEvents"]) {
      if (e["ph"] != "C") continue;
      if (e["name"] == "recompose: held for backward by the regions")
        trace_held = std::max(trace_held, e["args"]["bytes"].get<int64_t>());
      if (e["name"] == "recompose: device memory" && e["ts"].get<double>() >= last_ts) {
        last_ts = e["ts"].get<double>();
        trace_peak = e["args"]["peak since reset"].get<int64_t>();
      }
    }
    const auto json_held = ledger_json["totals"]["bytes_held"].get<int64_t>();
    const auto json_peak = ledger_json["timeline"]["peak_bytes"].get<int64_t>();
    REQUIRE(json_held > 0);
    CHECK(static_cast<double>(f.held) == doctest::Approx(json_held).epsilon(0.01));
    CHECK(static_cast<double>(trace_held) == doctest::Approx(json_held).epsilon(0.01));
    CHECK(static_cast<double>(f.peak) == doctest::Approx(json_peak).epsilon(0.01));
    CHECK(static_cast<double>(trace_peak) == doctest::Approx(json_peak).epsilon(0.01));
#endif
  }

  TEST_CASE("the keys memory_viz reads, and Python's pickle loads the file") {
    recompose::CpuMemoryCounting counting;
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    recompose::apply_checkpoint(net->block(1));
    recompose::record_memory_history(true);
    net->forward(torch::randn({4, 16})).sum().backward();
    recompose::record_memory_history(false);
    const std::string path = "memory_snapshot_test.pickle";
    recompose::dump_memory_snapshot(path);
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto snapshot = unpickled(bytes);
    for (const char* key :
         {"segments", "device_traces", "allocator_settings", "external_annotations"})
      CHECK(snapshot.contains(key));
    for (const IValue& s : snapshot.at("segments").toList()) {
      const auto segment = s.toGenericDict();
      for (const char* key : {"device", "address", "total_size", "allocated_size", "active_size",
                              "requested_size", "stream", "segment_type", "blocks", "frames"})
        CHECK(segment.contains(key));
    }
    const auto trace = trace_of(snapshot);
    REQUIRE_FALSE(trace.empty());
    int64_t last_time = 0;
    for (const auto& e : trace) {
      for (const char* key : {"action", "addr", "size", "stream", "time_us", "frames",
                              "compile_context", "user_metadata", "category"})
        CHECK(e.contains(key));
      CHECK(num(e, "time_us") >= last_time);
      last_time = num(e, "time_us");
    }
    CHECK(str(trace.back(), "action") == "snapshot");

    const std::string python = python_with_pickle();
    if (python.empty()) {
      MESSAGE("no Python with pickle here: the snapshot's load by Python's pickle is not checked");
    } else {
      const std::string script =
          "import pickle, sys\n"
          "d = pickle.load(open(sys.argv[1], 'rb'))\n"
          "t = d['device_traces'][0]\n"
          "keys = {'action', 'addr', 'size', 'stream', 'time_us', 'frames', 'user_metadata'}\n"
          "assert all(keys <= set(e) for e in t)\n"
          "print(len(t), sum(s['total_size'] for s in d['segments']),\n"
          "      sum(1 for e in t if e['user_metadata'].startswith('forward: ')))\n";
      const std::string out =
          run_command("'" + python + "' -c \"" + script + "\" " + path + " 2>&1");
      std::istringstream words(out);
      int64_t entries = -1, live = -1, forwards = -1;
      words >> entries >> live >> forwards;
      INFO("python said: " << out);
      CHECK(entries == static_cast<int64_t>(trace.size()));
      CHECK(live == figures_of(snapshot).live);
      CHECK(forwards ==
            static_cast<int64_t>(std::count_if(trace.begin(), trace.end(), [](const auto& e) {
              return str(e, "user_metadata").rfind("forward: ", 0) == 0;
            })));
      CHECK(forwards > 0);
    }
    std::remove(path.c_str());
  }

  TEST_CASE("max_entries keeps the newest entries and says the trace overflowed") {
    recompose::CpuMemoryCounting counting;
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    recompose::apply_checkpoint(net->block(0));
    recompose::record_memory_history(true, recompose::MemoryHistoryOptions().max_entries(4));
    net->forward(torch::randn({4, 16})).sum().backward();
    const auto last = torch::ones({7, 13});  // the newest allocation: kept
    recompose::record_memory_history(false);
    const auto snapshot = unpickled(recompose::memory_snapshot());
    const auto settings = snapshot.at("allocator_settings").toGenericDict();
    CHECK(settings.at("trace_alloc_overflowed").toBool());
    CHECK(num(settings, "trace_alloc_max_entries") == 4);
    int64_t allocs = 0, frees = 0;
    for (const auto& e : trace_of(snapshot)) {
      allocs += str(e, "action") == "alloc" ? 1 : 0;
      frees += str(e, "action") == "free_completed" ? 1 : 0;
    }
    CHECK(allocs + frees == 4);  // each recorded allocation and free once
    const auto trace = trace_of(snapshot);
    const auto newest = std::find_if(trace.rbegin(), trace.rend(),
                                     [](const auto& e) { return str(e, "action") == "alloc"; });
    REQUIRE(newest != trace.rend());
    CHECK(num(*newest, "addr") == reinterpret_cast<int64_t>(last.data_ptr()));
    CHECK(num(*newest, "size") == static_cast<int64_t>(last.nbytes()));
    forget_history();
  }

  TEST_CASE("replay, pack and reload as user metadata; nothing recorded once stopped") {
    recompose::CpuMemoryCounting counting;
    torch::manual_seed(6);
    rt::TanhStack net(std::vector<int64_t>{16, 64, 64, 16});
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    recompose::apply_offload(net->block(0), recompose::OffloadOptions().manager(manager));
    recompose::apply_offload(net->block(1), recompose::OffloadOptions().manager(manager));
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
    recompose::apply_checkpoint(net->block(2), recompose::CheckpointOptions().policy(
                                                   recompose::SelectivePolicy({"aten::addmm"})));
#endif
    recompose::record_memory_history(true);
    net->forward(torch::randn({32, 16}, torch::requires_grad())).sum().backward();
    recompose::record_memory_history(false);
    const auto metadata = alloc_metadata(unpickled(recompose::memory_snapshot()));
    CHECK(any_starts_with(metadata, "forward: #1 "));
    CHECK(any_starts_with(metadata, "pack: #1 "));
    CHECK(any_starts_with(metadata, "reload: #1 "));
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
    CHECK(any_starts_with(metadata, "replay: #3 "));
    CHECK_FALSE(any_starts_with(metadata, "rerun: #3 "));
#endif
    // Stopped: a second step leaves the history as it was.
    net->forward(torch::randn({32, 16}, torch::requires_grad())).sum().backward();
    CHECK(alloc_metadata(unpickled(recompose::memory_snapshot())) == metadata);
    forget_history();
  }
}
