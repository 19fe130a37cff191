// ledger/step_ledger_timeline_format.h: the timeline as a short section of text and as JSON.
#include "ledger/step_ledger_timeline_format.h"

#include "engine/format_bytes.h"

#include <map>
#include <sstream>

namespace recompose::detail {

std::string mark_name(const LedgerMark& mark) {
  if (mark.region < 0) return mark.label;
  return mark.label + " " + mark.kind;
}

std::string timeline_text(const LedgerTimeline& t) {
  std::ostringstream out;
  if (!t.measured()) {
    out << "memory timeline: not measured on " << t.device << " (" << t.marks.size()
        << " marks; CPU memory is counted only under recompose::CpuMemoryCounting)\n";
    return out.str();
  }
  out << "memory timeline (" << t.source << ", " << t.device << "), in use at each mark:\n";
  // One line per region: its forward's begin -> end, its last rebuild's begin -> end.
  struct Span {
    std::string name;
    int64_t forward[2] = {-1, -1}, rebuild[2] = {-1, -1};
  };
  std::map<int, Span> spans;
  for (const LedgerMark& m : t.marks) {
    if (m.region < 0) continue;
    Span& s = spans[m.region];
    s.name = m.label;
    if (m.kind == "forward begin") s.forward[0] = m.bytes;
    if (m.kind == "forward end") s.forward[1] = m.bytes;
    if (m.kind == "rebuild begin") s.rebuild[0] = m.bytes;
    if (m.kind == "rebuild end") s.rebuild[1] = m.bytes;
  }
  auto pair = [](const int64_t(&v)[2]) {
    if (v[0] < 0) return std::string("-");
    return format_bytes(v[0]) + " -> " + (v[1] < 0 ? std::string("?") : format_bytes(v[1]));
  };
  for (const auto& [index, s] : spans) {
    out << "  " << index + 1 << " " << s.name << ": forward " << pair(s.forward) << ", rebuild "
        << pair(s.rebuild) << "\n";
  }
  out << "  start " << format_bytes(t.marks.front().bytes);
  if (t.turn >= 0) {
    out << ", turn at \"" << mark_name(t.marks[t.turn]) << "\" "
        << format_bytes(t.marks[t.turn].bytes);
  } else {
    out << ", backward not reached";
  }
  out << ", read " << format_bytes(t.marks.back().bytes) << "\n";
  if (t.regions_at_turn >= 0) {
    out << "  in use at the turn: the regions hold " << format_bytes(t.regions_at_turn);
    if (t.rest_at_turn >= 0) {
      out << ", the rest of the step " << format_bytes(t.rest_at_turn)
          << " (parameters, optimizer state, saved tensors outside the regions, outputs)\n";
    } else {  // the rows hold storages allocated before the allocator counted
      out << ", more than the allocator counts (memory allocated before counting began)\n";
    }
  }
  out << "  peak " << format_bytes(t.peak_bytes);
  if (t.peak_mark == 0) {
    out << " at or before the ledger's start (reset_peak_device_memory before the step)";
  } else {
    out << " between \"" << mark_name(t.marks[t.peak_mark - 1]) << "\" and \""
        << mark_name(t.marks[t.peak_mark]) << "\""
        << (t.turn >= 0 && t.peak_mark > t.turn ? ", in backward" : ", in forward");
  }
  out << "\n  largest holders there:";
  if (t.holders.empty()) out << " none";
  for (std::size_t i = 0; i < t.holders.size(); ++i) {
    out << (i == 0 ? " " : ", ") << t.holders[i].name << " (#" << t.holders[i].region + 1 << ") "
        << format_bytes(t.holders[i].bytes);
  }
  out << "\n";
  return out.str();
}

json::Json timeline_json(const LedgerTimeline& t) {
  json::Json marks = json::Json::array();
  for (const LedgerMark& m : t.marks) {
    marks.push_back({{"kind", m.kind},
                     {"label", m.label},
                     {"region", m.region},
                     {"bytes", m.bytes},
                     {"peak", m.peak}});
  }
  json::Json holders = json::Json::array();
  for (const LedgerHolder& h : t.holders)
    holders.push_back({{"region", h.region}, {"name", h.name}, {"bytes", h.bytes}});
  return {{"device", t.device},
          {"source", t.source},
          {"measured", t.measured()},
          {"turn", t.turn},
          {"peak_bytes", t.peak_bytes},
          {"peak_mark", t.peak_mark},
          {"regions_at_turn", t.regions_at_turn},
          {"rest_at_turn", t.rest_at_turn},
          {"marks", std::move(marks)},
          {"holders", std::move(holders)}};
}

}  // namespace recompose::detail
