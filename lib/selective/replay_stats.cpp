#include "replay_stats.h"

#include "events/events.h"

#include <recompose/selective_checkpoint.h>

#include <atomic>
#include <mutex>
#include <string>

namespace recompose {
namespace {

std::atomic<bool> g_enabled{true};
std::mutex g_mutex;
SelectiveReplayStats g_stats;  // under g_mutex

}  // namespace

namespace detail {

void count_replay(const events::ReplayOutcome& outcome, int64_t replay_ns) {
  if (events::listening()) events::replayed(outcome);
  std::lock_guard lock(g_mutex);
  if (outcome.replayed) {
    ++g_stats.replayed;
    g_stats.ops_run += outcome.ops_run;
    g_stats.ops_skipped += outcome.ops_skipped;
    g_stats.ops_substituted += outcome.ops_substituted;
    g_stats.draws_written += outcome.draws_written;
    g_stats.casts_kept += outcome.casts_kept;
    g_stats.writes_carried += outcome.writes_carried;
    g_stats.replay_ns += replay_ns;
    g_stats.op_ns += outcome.op_ns;
  } else {
    ++g_stats.fallbacks;
    g_stats.last_fallback_reason = outcome.fallback_reason;
  }
}

}  // namespace detail

SelectiveReplayStats selective_replay_stats() {
  std::lock_guard lock(g_mutex);
  return g_stats;
}

void reset_selective_replay_stats() {
  std::lock_guard lock(g_mutex);
  g_stats = SelectiveReplayStats{};
}

void set_selective_replay_enabled(bool enabled) {
  g_enabled.store(enabled, std::memory_order_relaxed);
}

bool selective_replay_enabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace recompose
