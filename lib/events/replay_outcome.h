// ReplayOutcome: how one recomputation of a region by its contexts' replay went (selective
// checkpointing's, SavedTensorReplay), for the process's counters (selective_replay_stats) and
// the sinks of the region being rebuilt (events.h).
#pragma once

#include <cstdint>
#include <string>

namespace recompose::events {

struct ReplayOutcome {
  bool replayed = false;
  std::string fallback_reason;  // when !replayed
  int64_t ops_run = 0;
  int64_t ops_skipped = 0;
  int64_t op_ns = 0;            // host time in the ops' kernels (and in writing kept draws back)
  int64_t draws_written = 0;    // random ops not run: their kept draw written back (DrawMask,
                                // DropoutDraw)
  int64_t casts_kept = 0;       // autocast parameter casts not run: the forward's kept (KeptCast)
  int64_t ops_substituted = 0;  // ops run as a cheaper op (Node::replay_as)
  int64_t writes_carried = 0;   // writes of the forward its kept outputs carried (carry_write)
};

}  // namespace recompose::events
