// StepLedger as text (a table with a totals line) and as JSON (format "recompose.step_ledger",
// versioned: the version goes up when a member changes). Written by hand: the ledger's values are
// flat.
#include "engine/format_bytes.h"
#include "json/json_io.h"
#include "ledger/ledger_state.h"
#include "ledger/step_ledger_timeline_format.h"

#include <recompose/step_ledger.h>

#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>

namespace recompose {
namespace {

std::string ledger_ms(int64_t ns) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f ms", static_cast<double>(ns) / 1e6);
  return buffer;
}

double gb_per_s(int64_t bytes, int64_t ns) {
  return ns > 0 ? static_cast<double>(bytes) / static_cast<double>(ns) : 0.0;  // bytes/ns = GB/s
}

struct LedgerTotals {
  int64_t bytes_held = 0, rebuilds = 0, replays = 0, reruns = 0, not_rebuilt = 0;
  int64_t ops_run = 0, ops_skipped = 0, ops_substituted = 0, draws_written = 0;
  int64_t writes_carried = 0, host_ns = 0, offload_only = 0;
  int64_t tensors_kept = 0, bytes_kept = 0;
  LedgerSwap swap;

  explicit LedgerTotals(const std::vector<LedgerRegion>& regions) {
    for (const auto& r : regions) {
      bytes_held += r.bytes_held;
      rebuilds += r.rebuilds;
      replays += r.replays;
      reruns += r.reruns;
      not_rebuilt += r.checkpointed && r.rebuilds == 0 ? 1 : 0;
      offload_only += r.checkpointed ? 0 : 1;
      swap += r.swap;
      tensors_kept += r.tensors_kept();
      bytes_kept += r.bytes_kept();
      ops_run += r.ops_run;
      ops_skipped += r.ops_skipped;
      ops_substituted += r.ops_substituted;
      draws_written += r.draws_written;
      writes_carried += r.writes_carried;
      host_ns += r.host_ns;
    }
  }
};

// "1 tensor", "3 tensors".
std::string tensors(int64_t n) { return std::to_string(n) + (n == 1 ? " tensor" : " tensors"); }

// Pads `s` to `width` columns (names are ASCII: module paths and type names).
std::string cell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string to_string(LedgerMode mode) {
  switch (mode) {
    case LedgerMode::Full:
      return "full";
    case LedgerMode::Selective:
      return "selective";
    case LedgerMode::CustomContexts:
      return "custom contexts";
    case LedgerMode::Offload:
      return "offload";
  }
  return "?";
}

std::string to_string(LedgerInputs inputs) {
  switch (inputs) {
    case LedgerInputs::Held:
      return "held";
    case LedgerInputs::EnclosingRegion:
      return "enclosing region";
    case LedgerInputs::OuterPolicy:
      return "outer policy";
    case LedgerInputs::None:
      return "-";
  }
  return "?";
}

std::string to_string(LedgerRebuilt rebuilt) {
  switch (rebuilt) {
    case LedgerRebuilt::Replayed:
      return "replayed";
    case LedgerRebuilt::RanForwardAgain:
      return "ran the forward again";
    case LedgerRebuilt::ReplayedAndRanForwardAgain:
      return "replayed and ran the forward again";
    case LedgerRebuilt::NotRebuiltYet:
      return "not rebuilt yet";
    case LedgerRebuilt::NotCheckpointed:
      return "not checkpointed";
  }
  return "?";
}

LedgerRebuilt LedgerRegion::rebuilt() const {
  if (!checkpointed) return LedgerRebuilt::NotCheckpointed;
  if (rebuilds == 0) return LedgerRebuilt::NotRebuiltYet;
  if (replays != 0 && reruns != 0) return LedgerRebuilt::ReplayedAndRanForwardAgain;
  return replays != 0 ? LedgerRebuilt::Replayed : LedgerRebuilt::RanForwardAgain;
}

std::string LedgerRegion::mode_text() const {
  return to_string(mode) + (swap_inputs ? " + swap inputs" : "") + (offloaded ? " + offload" : "");
}

double LedgerSwap::to_host_gb_per_s() const { return gb_per_s(bytes_to_host_landed, to_host_ns); }
double LedgerSwap::to_device_gb_per_s() const {
  return gb_per_s(bytes_to_device_landed, to_device_ns);
}

LedgerSwap& LedgerSwap::operator+=(const LedgerSwap& o) {
  tensors_offloaded += o.tensors_offloaded;
  bytes_offloaded += o.bytes_offloaded;
  tensors_reloaded += o.tensors_reloaded;
  bytes_reloaded += o.bytes_reloaded;
  prefetched += o.prefetched;
  sync_loads += o.sync_loads;
  late_reloads += o.late_reloads;
  offload_wait_ns += o.offload_wait_ns;
  reload_wait_ns += o.reload_wait_ns;
  bytes_to_host_landed += o.bytes_to_host_landed;
  to_host_ns += o.to_host_ns;
  bytes_to_device_landed += o.bytes_to_device_landed;
  to_device_ns += o.to_device_ns;
  return *this;
}

int64_t LedgerRegion::tensors_kept() const {
  int64_t n = 0;
  for (const auto& k : kept) n += k.tensors;
  return n;
}

int64_t LedgerRegion::bytes_kept() const {
  int64_t n = 0;
  for (const auto& k : kept) n += k.bytes;
  return n;
}

namespace {

// The lines under a row that say what swap moved and kept for it (none when swap did nothing).
void swap_lines(std::ostream& out, const LedgerRegion& r) {
  auto gbps = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.2f GB/s", v);
    return std::string(buffer);
  };
  const LedgerSwap& w = r.swap;
  if (w.any()) {
    out << "    moved: " << tensors(w.tensors_offloaded) << " ("
        << detail::format_bytes(w.bytes_offloaded) << ") to host";
    if (w.bytes_to_host_landed != 0) out << " at " << gbps(w.to_host_gb_per_s());
    out << ", " << w.tensors_reloaded << " (" << detail::format_bytes(w.bytes_reloaded) << ") back";
    if (w.bytes_to_device_landed != 0) out << " at " << gbps(w.to_device_gb_per_s());
    out << "; " << w.prefetched << " prefetched, " << w.sync_loads << " loaded when asked, "
        << w.late_reloads << " late: "
        << (w.reload_stalled() ? "a reload stalled compute" : "no reload stalled compute")
        << "; host waited " << ledger_ms(w.offload_wait_ns) << " on copies out, "
        << ledger_ms(w.reload_wait_ns) << " on copies back\n";
  }
  if (!r.kept.empty()) {
    out << "    kept on the device: " << tensors(r.tensors_kept()) << " ("
        << detail::format_bytes(r.bytes_kept()) << "):";
    for (std::size_t k = 0; k < r.kept.size(); ++k) {
      out << (k == 0 ? " " : ", ") << r.kept[k].tensors << " " << r.kept[k].reason << " ("
          << detail::format_bytes(r.kept[k].bytes) << ")";
    }
    out << "\n";
  }
}

// A LedgerSwap as a JSON object.
detail::json::Json swap_json(const LedgerSwap& w) {
  return {{"tensors_offloaded", w.tensors_offloaded},
          {"bytes_offloaded", w.bytes_offloaded},
          {"tensors_reloaded", w.tensors_reloaded},
          {"bytes_reloaded", w.bytes_reloaded},
          {"prefetched", w.prefetched},
          {"sync_loads", w.sync_loads},
          {"late_reloads", w.late_reloads},
          {"reload_stalled", w.reload_stalled()},
          {"offload_wait_ns", w.offload_wait_ns},
          {"reload_wait_ns", w.reload_wait_ns},
          {"bytes_to_host_landed", w.bytes_to_host_landed},
          {"to_host_ns", w.to_host_ns},
          {"bytes_to_device_landed", w.bytes_to_device_landed},
          {"to_device_ns", w.to_device_ns}};
}

// One row as a JSON object.
detail::json::Json region_json(const LedgerRegion& r) {
  detail::json::Json kept = detail::json::Json::array();
  for (const LedgerKept& k : r.kept)
    kept.push_back({{"reason", k.reason}, {"tensors", k.tensors}, {"bytes", k.bytes}});
  return {{"name", r.name},
          {"depth", r.depth},
          {"mode", to_string(r.mode)},
          {"swap_inputs", r.swap_inputs},
          {"offloaded", r.offloaded},
          {"inputs", to_string(r.inputs)},
          {"bytes_held", r.bytes_held},
          {"rebuilt", to_string(r.rebuilt())},
          {"rebuilds", r.rebuilds},
          {"replays", r.replays},
          {"reruns", r.reruns},
          {"fallback_reason", r.fallback_reason},
          {"ops_run", r.ops_run},
          {"ops_skipped", r.ops_skipped},
          {"ops_substituted", r.ops_substituted},
          {"draws_written", r.draws_written},
          {"writes_carried", r.writes_carried},
          {"host_ns", r.host_ns},
          {"unmatched_policy_names", r.unmatched_policy_names},
          {"checkpointed", r.checkpointed},
          {"plan_entry", r.plan_entry},
          {"plan_bytes", r.plan_bytes},
          {"swap", swap_json(r.swap)},
          {"kept", std::move(kept)}};
}

// The totals line as a JSON object.
detail::json::Json totals_json(const LedgerTotals& t, std::size_t rows) {
  return {{"regions", rows},
          {"bytes_held", t.bytes_held},
          {"bytes_held_covers",
           "the rows' inputs and kept outputs when their forwards ended, each storage once; not "
           "the rest of the step (timeline.rest_at_turn)"},
          {"rebuilds", t.rebuilds},
          {"replays", t.replays},
          {"reruns", t.reruns},
          {"not_rebuilt", t.not_rebuilt},
          {"ops_run", t.ops_run},
          {"ops_skipped", t.ops_skipped},
          {"ops_substituted", t.ops_substituted},
          {"draws_written", t.draws_written},
          {"writes_carried", t.writes_carried},
          {"host_ns", t.host_ns},
          {"offload_only", t.offload_only},
          {"swap", swap_json(t.swap)},
          {"tensors_kept", t.tensors_kept},
          {"bytes_kept", t.bytes_kept}};
}

}  // namespace

std::string StepLedger::str() const {
  const std::vector<LedgerRegion> regions = this->regions();
  std::size_t name_width = 6;
  for (const auto& r : regions) name_width = std::max(name_width, 2 * r.depth + r.name.size() + 2);
  std::ostringstream out;
  const LedgerTotals t(regions);
  const auto checkpointed = static_cast<int64_t>(regions.size()) - t.offload_only;
  out << "recompose step ledger: " << checkpointed << " checkpointed region"
      << (checkpointed == 1 ? "" : "s");
  if (t.offload_only != 0) {
    out << ", " << t.offload_only << " offloaded call" << (t.offload_only == 1 ? "" : "s")
        << " (apply_offload only)";
  }
  out << "\n";
  out << cell("#", 4) << cell("region", name_width) << cell("mode", 18) << cell("inputs", 18)
      << cell("held", 12) << cell("rebuilt", 24) << cell("ops run/skipped/subst", 22)
      << cell("draws", 7) << "host time\n";
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const LedgerRegion& r = regions[i];
    const std::string ops = r.replays == 0
                                ? "-"
                                : std::to_string(r.ops_run) + "/" + std::to_string(r.ops_skipped) +
                                      "/" + std::to_string(r.ops_substituted);
    std::string rebuilt = to_string(r.rebuilt());
    if (r.rebuilds > 1) rebuilt += " (" + std::to_string(r.rebuilds) + "x)";
    out << cell(std::to_string(i + 1), 4)
        << cell(std::string(2 * r.depth, ' ') + r.name, name_width) << cell(r.mode_text(), 18)
        << cell(to_string(r.inputs), 18) << cell(detail::format_bytes(r.bytes_held), 12)
        << cell(rebuilt, 24) << cell(ops, 22)
        << cell(r.replays == 0 ? "-" : std::to_string(r.draws_written), 7)
        << (r.rebuilds == 0 ? "-" : ledger_ms(r.host_ns)) << "\n";
    if (!r.plan_entry.empty()) {
      out << "    plan: " << r.plan_entry << "; estimated " << detail::format_bytes(r.plan_bytes)
          << " held for backward, measured " << detail::format_bytes(r.bytes_held) << "\n";
    }
    swap_lines(out, r);
    if (!r.fallback_reason.empty() && r.reruns != 0)
      out << "    why it ran the forward again: " << r.fallback_reason << "\n";
    if (!r.unmatched_policy_names.empty()) {
      out << "    names in its policy that no op matched (they kept nothing here):";
      for (const std::string& name : r.unmatched_policy_names) out << " " << name;
      out << "\n";
    }
  }
  // The regions' share only: what the rest of the step holds is the timeline's (at the turn) or
  // a SavedTensorMeter's around the whole step.
  out << "total of the " << regions.size() << " row" << (regions.size() == 1 ? "" : "s") << ": "
      << detail::format_bytes(t.bytes_held)
      << " held when their forwards ended (inputs and kept outputs, each storage once; before "
         "offload's copies left; the rest of the step is not counted here); "
      << t.replays << " replayed, " << t.reruns << " ran the forward again, " << t.not_rebuilt
      << " not rebuilt yet; replays ran " << t.ops_run << " ops, skipped " << t.ops_skipped
      << ", substituted " << t.ops_substituted << ", wrote back " << t.draws_written
      << " draws; rebuilds took " << ledger_ms(t.host_ns) << "\n";
  if (t.swap.any() || t.tensors_kept != 0) {
    const int64_t stalls = t.swap.sync_loads + t.swap.late_reloads;
    out << "swap: " << tensors(t.swap.tensors_offloaded) << " ("
        << detail::format_bytes(t.swap.bytes_offloaded) << ") to host, " << t.swap.tensors_reloaded
        << " (" << detail::format_bytes(t.swap.bytes_reloaded) << ") back, " << stalls << " reload"
        << (stalls == 1 ? "" : "s") << " stalled compute; " << tensors(t.tensors_kept) << " ("
        << detail::format_bytes(t.bytes_kept) << ") kept on the device\n";
  }
  out << detail::timeline_text(timeline());
  return out.str();
}

// Note [ The ledger's JSON format ]
// "recompose.step_ledger", versioned: a reader checks the version it knows. Version 2: the
// timeline's regions_at_turn and rest_at_turn, totals.bytes_held_covers. Version 3: a row's mode
// is the LedgerMode alone ("full", "selective", "custom contexts", "offload"), with swap_inputs
// and offloaded beside it (version 2 wrote "full + swap inputs + offload" in mode).
constexpr int kLedgerFormatVersion = 3;

std::string StepLedger::json() const {
  const std::vector<LedgerRegion> regions = this->regions();
  detail::json::Json rows = detail::json::Json::array();
  for (const LedgerRegion& r : regions) rows.push_back(region_json(r));
  const detail::json::Json document = {
      {"format", "recompose.step_ledger"},
      {"version", kLedgerFormatVersion},
      {"regions", std::move(rows)},
      {"totals", totals_json(LedgerTotals(regions), regions.size())},
      {"timeline", detail::timeline_json(timeline())}};
  return detail::json::dump(document);
}

std::ostream& operator<<(std::ostream& out, const StepLedger& ledger) {
  return out << ledger.str();
}

}  // namespace recompose
