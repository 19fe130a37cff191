#include "replay_cost.h"

#include "selective/run_set_walk.h"

#include <algorithm>
#include <cstddef>

namespace recompose::detail {

ReplayCost::ReplayCost(const ModuleProfile& module)
    : module_(module), walks_(module.dependencies_recorded && module.replayed) {}

std::vector<bool> ReplayCost::runs(const std::vector<bool>& answered) const {
  const auto& ops = module_.ops;
  std::vector<bool> run(ops.size(), false);
  if (!walks_) {
    for (size_t k = 0; k < ops.size(); ++k) run[k] = !answered[k];
    return run;
  }
  // The replay's own walk, over the ops' recorded reads.
  std::vector<char> walked(ops.size(), 0);
  for (size_t k = 0; k < ops.size(); ++k) walked[k] = ops[k].saved_for_backward ? 1 : 0;
  walk_run_set(
      walked, [](size_t) -> MaybeFallback { return std::nullopt; },
      [&](size_t k) { return bool(answered[k]); },
      [&](size_t k, auto&& mark) -> MaybeFallback {
        for (const int64_t r : ops[k].reads) {
          if (r >= 0 && static_cast<size_t>(r) < ops.size()) mark(static_cast<size_t>(r));
        }
        return std::nullopt;
      });
  // An answered op in the walk hands its kept output: it does not run.
  for (size_t k = 0; k < ops.size(); ++k) run[k] = walked[k] && !answered[k];
  return run;
}

double ReplayCost::seconds(const std::vector<bool>& answered) const {
  const std::vector<bool> run = runs(answered);
  double total = 0;
  for (size_t k = 0; k < run.size(); ++k) {
    if (run[k]) total += std::max(0.0, module_.ops[k].seconds);
  }
  return total;
}

}  // namespace recompose::detail
