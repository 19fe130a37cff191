#include "replay_cost.h"

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
  // From the dropped ops whose outputs autograd saved, back through what they read; an answered
  // op ends the walk (its cache entry stands in for everything before it).
  std::vector<size_t> pending;
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].saved_for_backward && !answered[k]) run[k] = true, pending.push_back(k);
  }
  while (!pending.empty()) {
    const size_t k = pending.back();
    pending.pop_back();
    for (const int64_t r : ops[k].reads) {
      const auto from = static_cast<size_t>(r);
      if (from < ops.size() && !answered[from] && !run[from])
        run[from] = true, pending.push_back(from);
    }
  }
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
