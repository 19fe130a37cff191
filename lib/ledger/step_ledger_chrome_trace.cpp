// StepLedger as a Chrome trace (Perfetto, chrome://tracing): the rows' forwards and rebuilds and
// swap's copies as slices, what the rows hold, what is on host and in flight, and the memory in
// use as counters, on the clock of LibTorch's profiler (the system clock: a trace it saved keeps
// its events at baseTimeNanoseconds + ts), so that the two can be one file.
#include "json/json_io.h"
#include "ledger/ledger_state.h"

#include <recompose/checkpoint_error.h>
#include <recompose/step_ledger.h>

#include <unistd.h>

#include <map>

namespace recompose {
namespace {

using detail::json::Json;

// recompose's tracks: threads of their own in the process's group.
constexpr int kRegionsTrack = 0x7ec0;
constexpr int kCopiesTrack = 0x7ec1;

struct TraceClock {
  int64_t base_ns;
  double us(int64_t ns) const { return static_cast<double>(ns - base_ns) / 1e3; }
};

Json track_name(int pid, int tid, const char* name) {
  return {
      {"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

Json counter(int pid, const char* name, double ts, Json args) {
  return {{"name", name}, {"ph", "C"}, {"pid", pid}, {"ts", ts}, {"args", std::move(args)}};
}

Json slice(int pid, int tid, const std::string& name, const char* category, double ts, double end,
           Json args) {
  return {{"name", name}, {"cat", category}, {"ph", "X"},       {"pid", pid},
          {"tid", tid},   {"ts", ts},        {"dur", end - ts}, {"args", std::move(args)}};
}

// The ledger's events, on `clock`.
Json trace_events(const detail::LedgerState& ledger, const TraceClock& clock) {
  const int pid = static_cast<int>(::getpid());
  Json events = Json::array();
  events.push_back(track_name(pid, kRegionsTrack, "recompose: regions (forward, rebuild)"));
  events.push_back(track_name(pid, kCopiesTrack, "recompose: swap copies"));
  // Forward and rebuild slices from the samples that open and close them.
  std::map<std::pair<int, bool>, int64_t> open;  // (row, rebuild) -> start
  for (const detail::LedgerSample& s : ledger.samples) {
    const LedgerMark& m = s.mark;
    const double ts = clock.us(s.time_ns);
    events.push_back(
        counter(pid, "recompose: held for backward by the regions", ts, {{"bytes", s.held()}}));
    if (m.bytes >= 0) {
      events.push_back(counter(pid, "recompose: device memory", ts,
                               {{"in use", m.bytes}, {"peak since reset", m.peak}}));
    }
    if (m.region < 0) {
      if (m.kind == "mark") {
        events.push_back({{"name", m.label},
                          {"ph", "i"},
                          {"s", "p"},
                          {"pid", pid},
                          {"tid", kRegionsTrack},
                          {"ts", ts}});
      }
      continue;
    }
    const bool rebuild = m.kind.starts_with("rebuild");
    if (m.kind.ends_with("begin")) {
      open[{m.region, rebuild}] = s.time_ns;
      continue;
    }
    auto it = open.find({m.region, rebuild});
    if (it == open.end()) continue;
    const auto& row = ledger.rows[m.region]->region;
    events.push_back(slice(
        pid, kRegionsTrack, m.label, rebuild ? "rebuild" : "forward", clock.us(it->second), ts,
        {{"mode", row.mode_text()}, {"rebuilt", to_string(row.rebuilt())}, {"bytes", m.bytes}}));
    open.erase(it);
  }
  for (const detail::LedgerCopy& c : ledger.copies) {
    const bool to_host = c.direction == events::CopyDirection::ToHost;
    events.push_back(slice(pid, kCopiesTrack,
                           (to_host ? "to host: " : "back: ") + ledger.rows[c.row]->region.name,
                           "copy", clock.us(c.start_ns), clock.us(c.end_ns), {{"bytes", c.bytes}}));
  }
  for (const detail::LedgerCopyLevel& l : ledger.copy_levels) {
    events.push_back(counter(pid, "recompose: swap", clock.us(l.time_ns),
                             {{"in flight", l.in_flight}, {"on host", l.on_host}}));
  }
  return events;
}

}  // namespace

std::string StepLedger::chrome_trace() const {
  std::lock_guard lock(state_->mutex);
  const int64_t base = state_->samples.empty() ? 0 : state_->samples.front().time_ns;
  Json trace = {{"traceEvents", trace_events(*state_, {base})},
                {"displayTimeUnit", "ms"},
                {"baseTimeNanoseconds", base}};
  return trace.dump();
}

void StepLedger::write_chrome_trace(const std::string& path,
                                    const std::string& profiler_trace) const {
  std::string text;
  if (profiler_trace.empty()) {
    text = chrome_trace();
  } else {
    Json trace = Json::parse(detail::json::read_text(profiler_trace), nullptr,
                             /*allow_exceptions=*/false);
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
      throw CheckpointError("recompose: StepLedger::write_chrome_trace: " + profiler_trace +
                            " is not a Chrome trace (a JSON object with a traceEvents array)");
    }
    // The profiler's clock: ts in us after baseTimeNanoseconds (0, or absent: since the epoch).
    const int64_t base = trace.value("baseTimeNanoseconds", int64_t{0});
    std::lock_guard lock(state_->mutex);
    for (auto& event : trace_events(*state_, {base})) trace["traceEvents"].push_back(event);
    text = trace.dump();
  }
  detail::json::write_text(path, text);
}

}  // namespace recompose
