// Counts of the collectives a rank issued, by kind and by the phase that asked for them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace sharded {

// Forward: pre-forward unshard. Recompute: pre-forward unshard while a checkpointed block is
// recomputed in backward. Backward: unshard before an uncheckpointed block's backward, and every
// gradient reduce-scatter. State: gathering the full model to read or save it.
enum class Phase : std::size_t { Forward, Recompute, Backward, State };
inline constexpr std::size_t kPhases = 4;
inline constexpr const char* phase_name(Phase p) {
  constexpr const char* names[kPhases] = {"forward", "recompute", "backward", "state"};
  return names[std::size_t(p)];
}

struct CollectiveCounts {
  std::array<int64_t, kPhases> all_gather{};
  std::array<int64_t, kPhases> reduce_scatter{};
  // Unshard requests that found the block's parameters already there (no collective issued).
  int64_t unshard_already_done = 0;
  int64_t bytes = 0;   // bytes received by all-gathers plus bytes sent by reduce-scatters
  double seconds = 0;  // time spent waiting in collectives

  int64_t& gathers(Phase p) { return all_gather[std::size_t(p)]; }
  int64_t gathers(Phase p) const { return all_gather[std::size_t(p)]; }
  int64_t& scatters(Phase p) { return reduce_scatter[std::size_t(p)]; }
  int64_t scatters(Phase p) const { return reduce_scatter[std::size_t(p)]; }
};

}  // namespace sharded
