// What a selective configuration of one module costs in backward beyond the fixed cost (the
// interception and the replay's own work): the ops its recomputation runs. A selective replay
// (docs/architecture.md, "Selective replay") runs only the dropped ops whose outputs backward
// needs: the producers of the tensors autograd saved, and transitively the dropped ops those read,
// stopping at outputs answered from the cache (kept, or offloaded and reloaded): the replay's own
// walk (selective/run_set_walk.h) over the reads its forward trace exported to the profile. A
// module that runs its forward again (no replay), or a profile without the ops' dependencies,
// runs every op not answered.
#pragma once

#include <recompose/memory_profile.h>

#include <vector>

namespace recompose::detail {

class ReplayCost {
 public:
  explicit ReplayCost(const ModuleProfile& module);

  // The recomputation is modelled as a replay's dependency walk (the profile recorded the ops'
  // dependencies and the module replays); false: every op not answered runs.
  bool walks() const { return walks_; }

  // Per op of the module: whether its recomputation runs it when the ops with answered[k] are
  // answered from the cache (answered has one entry per op).
  std::vector<bool> runs(const std::vector<bool>& answered) const;

  // The measured forward seconds of the ops runs(answered) marks. O(ops + reads).
  double seconds(const std::vector<bool>& answered) const;

 private:
  const ModuleProfile& module_;
  bool walks_ = false;
};

}  // namespace recompose::detail
