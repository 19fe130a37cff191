// The memory timeline of a StepLedger as text (the section under the ledger's table) and as JSON
// (the "timeline" member of StepLedger::json()).
#pragma once

#include "json/json_io.h"

#include <recompose/step_ledger.h>

#include <string>

namespace recompose::detail {

std::string timeline_text(const LedgerTimeline& timeline);
json::Json timeline_json(const LedgerTimeline& timeline);
// "blocks.0 forward end", "backward", "start".
std::string mark_name(const LedgerMark& mark);

}  // namespace recompose::detail
