// StepLedger's memory timeline: samples of the device's memory at the ledger's hook points and
// marks, and the step's peak, turn and largest holders from them. See
// include/recompose/step_ledger.h.
#include "ledger/ledger_state.h"
#include "memory/memory_in_use.h"

#include <recompose/step_ledger.h>

#include <algorithm>
#include <chrono>

namespace recompose {
namespace detail {

namespace {

LedgerSample take_sample(const LedgerState& ledger, const char* kind, const LedgerRow* row,
                         const std::string& label) {
  LedgerSample sample;
  sample.mark.kind = kind;
  sample.mark.label = row != nullptr ? row->region.name : label;
  sample.mark.region = row != nullptr ? row->index : -1;
  const MemoryReading reading = read_memory(ledger.device);
  sample.mark.bytes = reading.current;
  sample.mark.peak = reading.peak;
  sample.time_ns = ledger_now_ns();
  for (const auto& r : ledger.rows) {
    if (r->live != 0) sample.live.emplace_back(r->index, r->live);
  }
  return sample;
}

}  // namespace

int64_t ledger_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void ledger_sample(LedgerState& ledger, const char* kind, const LedgerRow* row,
                   const std::string& label) {
  if (!ledger.is_open()) return;
  ledger.samples.push_back(take_sample(ledger, kind, row, label));
}

}  // namespace detail

LedgerTimeline StepLedger::timeline() const {
  std::lock_guard lock(state_->mutex);
  LedgerTimeline t;
  t.device = state_->device.str();
  t.source = detail::memory_source(state_->device);
  std::vector<detail::LedgerSample> samples = state_->samples;
  samples.push_back(detail::take_sample(*state_, "read", nullptr, "read"));
  for (const auto& s : samples) t.marks.push_back(s.mark);
  for (std::size_t i = 0; i < t.marks.size() && t.turn < 0; ++i) {
    const LedgerMark& m = t.marks[i];
    if ((m.kind == "mark" && m.label == "backward") || m.kind == "rebuild begin")
      t.turn = static_cast<int>(i);
  }
  if (t.turn >= 0) {
    t.regions_at_turn = samples[t.turn].held();
    if (t.measured()) t.rest_at_turn = t.marks[t.turn].bytes - t.regions_at_turn;
  }
  if (!t.measured()) return t;
  // The allocator's peak only grows between resets: the last reading is the step's peak, first
  // read at the sample that ends the interval it was reached in.
  t.peak_bytes = t.marks.back().peak;
  auto at = static_cast<int>(t.marks.size()) - 1;
  while (at > 0 && t.marks[at - 1].peak == t.peak_bytes) --at;
  t.peak_mark = at;
  const int fuller =
      at > 0 && t.marks[at - 1].bytes > t.marks[at].bytes ? at - 1 : at;  // more in use there
  auto live = samples[fuller].live;
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (live.size() > 5) live.resize(5);
  for (const auto& [index, bytes] : live)
    t.holders.push_back(LedgerHolder{index, state_->rows[index]->region.name, bytes});
  return t;
}

void StepLedger::mark(const std::string& label) {
  std::lock_guard lock(state_->mutex);
  detail::ledger_sample(*state_, "mark", nullptr, label);
}

}  // namespace recompose
