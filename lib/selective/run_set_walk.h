// The walk that decides which ops a selective replay runs (Note [ The replay's contract ],
// replay_plan.cpp), shared by the replay's plan (plan_replay) and the planner's
// price of a selective configuration (planner/replay_cost.h): the planner prices the walk the
// replay makes, not a copy of it.
#pragma once

#include "replay_fallback.h"

#include <cstddef>
#include <vector>

namespace recompose::detail {

// On entry, run[n] marks the ops whose outputs backward needs directly (the producers of the
// saved tensors it needs); on exit, also every op those need: going back from the last op, each
// op marked is first checked (`check(n)`: why the region cannot be replayed, if it cannot); an op
// answered from its cache entry (`answered(n)`, a kept output) ends the walk there, any other
// marks the producers of what it reads (`mark_producers(n, mark)`, calling mark(p) for each, and
// returning why the region cannot be replayed, if it cannot). Producers precede their readers in a
// trace, so one pass suffices there; a producer marked after its reader's position (a profile's
// op reads what a later write into its output read) takes another pass. Each op is visited once.
// Returns the first fallback met, or none.
template <class Check, class Answered, class MarkProducers>
MaybeFallback walk_run_set(std::vector<char>& run, Check&& check, Answered&& answered,
                           MarkProducers&& mark_producers) {
  std::vector<char> visited(run.size(), 0);
  for (bool again = true; again;) {
    again = false;
    for (std::size_t n = run.size(); n-- > 0;) {
      if (!run[n] || visited[n]) continue;
      visited[n] = 1;
      if (MaybeFallback why = check(n)) return why;
      if (answered(n)) continue;
      auto mark = [&run, &again, n](std::size_t producer) {
        if (!run[producer] && producer > n) again = true;
        run[producer] = 1;
      };
      if (MaybeFallback why = mark_producers(n, mark)) return why;
    }
  }
  return std::nullopt;
}

}  // namespace recompose::detail
