// StepLedger as text (a table with a totals line) and as JSON. Written by hand: the engine has
// no JSON dependency (nlohmann/json is the planner's), and the ledger's values are flat.
#include "engine/format_bytes.h"
#include "engine/json_string.h"
#include "engine/step_ledger_state.h"
#include "engine/step_ledger_timeline_format.h"

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

struct LedgerTotals {
  int64_t bytes_held = 0, rebuilds = 0, replays = 0, reruns = 0, not_rebuilt = 0;
  int64_t ops_run = 0, ops_skipped = 0, ops_substituted = 0, draws_written = 0;
  int64_t writes_carried = 0, host_ns = 0;

  explicit LedgerTotals(const std::vector<LedgerRegion>& regions) {
    for (const auto& r : regions) {
      bytes_held += r.bytes_held;
      rebuilds += r.rebuilds;
      replays += r.replays;
      reruns += r.reruns;
      not_rebuilt += r.rebuilds == 0 ? 1 : 0;
      ops_run += r.ops_run;
      ops_skipped += r.ops_skipped;
      ops_substituted += r.ops_substituted;
      draws_written += r.draws_written;
      writes_carried += r.writes_carried;
      host_ns += r.host_ns;
    }
  }
};

// Pads `s` to `width` columns (names are ASCII: module paths and type names).
std::string cell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string LedgerRegion::rebuilt() const {
  if (rebuilds == 0) return "not rebuilt yet";
  if (replays != 0 && reruns != 0) return "replayed and ran the forward again";
  return replays != 0 ? "replayed" : "ran the forward again";
}

std::string StepLedger::str() const {
  const std::vector<LedgerRegion> regions = this->regions();
  std::size_t name_width = 6;
  for (const auto& r : regions) name_width = std::max(name_width, 2 * r.depth + r.name.size() + 2);
  std::ostringstream out;
  out << "recompose step ledger: " << regions.size() << " checkpointed region"
      << (regions.size() == 1 ? "" : "s") << "\n";
  out << cell("#", 4) << cell("region", name_width) << cell("mode", 18) << cell("inputs", 18)
      << cell("held", 12) << cell("rebuilt", 24) << cell("ops run/skipped/subst", 22)
      << cell("draws", 7) << "host time\n";
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const LedgerRegion& r = regions[i];
    const std::string ops = r.replays == 0
                                ? "-"
                                : std::to_string(r.ops_run) + "/" + std::to_string(r.ops_skipped) +
                                      "/" + std::to_string(r.ops_substituted);
    std::string rebuilt = r.rebuilt();
    if (r.rebuilds > 1) rebuilt += " (" + std::to_string(r.rebuilds) + "x)";
    out << cell(std::to_string(i + 1), 4)
        << cell(std::string(2 * r.depth, ' ') + r.name, name_width) << cell(r.mode, 18)
        << cell(r.inputs, 18) << cell(detail::format_bytes(r.bytes_held), 12) << cell(rebuilt, 24)
        << cell(ops, 22) << cell(r.replays == 0 ? "-" : std::to_string(r.draws_written), 7)
        << (r.rebuilds == 0 ? "-" : ledger_ms(r.host_ns)) << "\n";
    if (!r.fallback_reason.empty() && r.reruns != 0)
      out << "    why it ran the forward again: " << r.fallback_reason << "\n";
    if (!r.unmatched_policy_names.empty()) {
      out << "    names in its policy that no op matched (they kept nothing here):";
      for (const std::string& name : r.unmatched_policy_names) out << " " << name;
      out << "\n";
    }
  }
  const LedgerTotals t(regions);
  out << "total: " << detail::format_bytes(t.bytes_held) << " held for backward; " << t.replays
      << " replayed, " << t.reruns << " ran the forward again, " << t.not_rebuilt
      << " not rebuilt yet; replays ran " << t.ops_run << " ops, skipped " << t.ops_skipped
      << ", substituted " << t.ops_substituted << ", wrote back " << t.draws_written
      << " draws; rebuilds took " << ledger_ms(t.host_ns) << "\n";
  out << detail::timeline_text(timeline());
  return out.str();
}

std::string StepLedger::json() const {
  const std::vector<LedgerRegion> regions = this->regions();
  std::ostringstream out;
  out << "{\"regions\": [";
  using detail::json_string;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const LedgerRegion& r = regions[i];
    out << (i == 0 ? "" : ", ") << "{\"name\": " << json_string(r.name)
        << ", \"depth\": " << r.depth << ", \"mode\": " << json_string(r.mode)
        << ", \"inputs\": " << json_string(r.inputs) << ", \"bytes_held\": " << r.bytes_held
        << ", \"rebuilt\": " << json_string(r.rebuilt()) << ", \"rebuilds\": " << r.rebuilds
        << ", \"replays\": " << r.replays << ", \"reruns\": " << r.reruns
        << ", \"fallback_reason\": " << json_string(r.fallback_reason)
        << ", \"ops_run\": " << r.ops_run << ", \"ops_skipped\": " << r.ops_skipped
        << ", \"ops_substituted\": " << r.ops_substituted
        << ", \"draws_written\": " << r.draws_written
        << ", \"writes_carried\": " << r.writes_carried << ", \"host_ns\": " << r.host_ns
        << ", \"unmatched_policy_names\": [";
    for (std::size_t k = 0; k < r.unmatched_policy_names.size(); ++k)
      out << (k == 0 ? "" : ", ") << json_string(r.unmatched_policy_names[k]);
    out << "]}";
  }
  const LedgerTotals t(regions);
  out << "], \"totals\": {\"regions\": " << regions.size() << ", \"bytes_held\": " << t.bytes_held
      << ", \"rebuilds\": " << t.rebuilds << ", \"replays\": " << t.replays
      << ", \"reruns\": " << t.reruns << ", \"not_rebuilt\": " << t.not_rebuilt
      << ", \"ops_run\": " << t.ops_run << ", \"ops_skipped\": " << t.ops_skipped
      << ", \"ops_substituted\": " << t.ops_substituted
      << ", \"draws_written\": " << t.draws_written << ", \"writes_carried\": " << t.writes_carried
      << ", \"host_ns\": " << t.host_ns << "}, \"timeline\": " << detail::timeline_json(timeline())
      << "}";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const StepLedger& ledger) {
  return out << ledger.str();
}

}  // namespace recompose
