// The out-of-memory explainer of the step ledger: where in the step an out-of-memory error came,
// what the regions held for backward then, and what they could hold less, appended to the
// error's message (c10::Error::add_context keeps its type, so a caller's catch still matches).
#include "engine/format_bytes.h"
#include "ledger/ledger_state.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace recompose::detail {

namespace {

// The first line of the view: an error that passes through nested regions gets it once.
constexpr const char* kHeading = "recompose step ledger at this out-of-memory error";

std::string label(const LedgerRow& row) {
  return row.region.name + " (" + row.region.mode_text() + ")";
}

std::string view(LedgerState& ledger, const LedgerRow* at, bool in_backward) {
  std::lock_guard lock(ledger.mutex);
  const auto& rows = ledger.rows;
  std::ostringstream out;
  out << kHeading << ": ";
  auto position = std::find_if(rows.begin(), rows.end(),
                               [&](const std::shared_ptr<LedgerRow>& r) { return r.get() == at; });
  const auto index = static_cast<std::size_t>(position - rows.begin());
  if (position == rows.end()) {
    out << "outside any checkpointed region, " << rows.size() << " region"
        << (rows.size() == 1 ? "" : "s") << " recorded so far";
  } else if (in_backward) {
    out << "in backward, rebuilding region " << index + 1 << " of " << rows.size() << ": "
        << label(**position);
  } else {
    out << "in the forward of region " << index + 1 << ": " << label(**position);
  }
  // What each region holds now (its inputs and kept outputs: `live`), the largest first.
  std::vector<const LedgerRow*> by_bytes;
  int64_t held = 0, kept_outputs = 0, inputs = 0;
  for (const auto& r : rows) {
    by_bytes.push_back(r.get());
    held += r->live;
    inputs += std::min(r->input_bytes, r->live);
    if (r->region.mode == LedgerMode::Selective) kept_outputs += r->live - r->input_bytes;
  }
  std::stable_sort(by_bytes.begin(), by_bytes.end(),
                   [](const LedgerRow* a, const LedgerRow* b) { return a->live > b->live; });
  out << "\n  held for backward by the regions now: " << format_bytes(held);
  if (!by_bytes.empty() && by_bytes.front()->live > 0) {
    out << "; the most:";
    for (std::size_t i = 0; i < by_bytes.size() && i < 3 && by_bytes[i]->live > 0; ++i) {
      out << (i == 0 ? " " : ", ") << by_bytes[i]->region.name << " "
          << format_bytes(by_bytes[i]->live);
    }
  }
  out << "\n  could hold less: ";
  if (kept_outputs > 0) {
    out << format_bytes(kept_outputs)
        << " of op outputs kept by selective regions (full checkpointing keeps none and "
           "recomputes them in backward); ";
  }
  out << format_bytes(inputs)
      << " of region inputs (apply_offload, or CheckpointOptions().swap_inputs(true), keeps "
         "them in host memory until backward)";
  if (in_backward) {
    out << "; in backward the peak also holds what the rebuild recomputes: fewer blocks per "
           "region (checkpoint_sequential with more segments) lower it";
  }
  return out.str();
}

bool explained(const c10::Error& e) {
  const auto& context = e.context();
  return std::any_of(context.begin(), context.end(),
                     [](const std::string& line) { return line.rfind(kHeading, 0) == 0; });
}

}  // namespace

void ledger_explain_oom(const std::exception_ptr& error, LedgerRow& row, bool in_backward) {
  if (!error || !row.ledger) return;
  try {
    std::rethrow_exception(error);
  } catch (c10::OutOfMemoryError& e) {  // the same object the caller rethrows
    if (!explained(e)) e.add_context(view(*row.ledger, &row, in_backward));
  } catch (...) {  // NOLINT(bugprone-empty-catch): other errors go through unchanged
  }
}

}  // namespace recompose::detail

namespace recompose {

std::string StepLedger::explain_out_of_memory() const {
  bool in_backward = false;
  const events::RegionTag* here = events::running_here(in_backward);
  // This ledger's row of the region running here (none: another ledger's region, or none).
  const auto* at =
      here != nullptr ? static_cast<const detail::LedgerRow*>(here->context_of(*state_)) : nullptr;
  return detail::view(*state_, at, in_backward);
}

}  // namespace recompose
