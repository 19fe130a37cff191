// The process-wide counters of selective replay (recompose::selective_replay_stats) and its
// switch (recompose::set_selective_replay_enabled).
#pragma once

#include "events/replay_outcome.h"

#include <cstdint>

namespace recompose::detail {

// Counts one recomputation of a selective region: replayed (with its ops and times) or fallen
// back (with its reason).
void count_replay(const events::ReplayOutcome& outcome, int64_t replay_ns);

}  // namespace recompose::detail
