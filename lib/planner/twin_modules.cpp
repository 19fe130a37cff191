#include "twin_modules.h"

#include <algorithm>
#include <vector>

namespace recompose::detail {
namespace {

bool same_work(const ModuleProfile& a, const ModuleProfile& b) {
  // Not saved_bytes: a block's input that the block before saved is counted there, not here.
  if (a.type != b.type || a.calls != b.calls || a.input_bytes != b.input_bytes ||
      a.shared_input_bytes != b.shared_input_bytes || a.draw_bytes != b.draw_bytes ||
      a.ops.size() != b.ops.size() || a.replayed != b.replayed ||
      a.dependencies_recorded != b.dependencies_recorded) {
    return false;
  }
  for (size_t k = 0; k < a.ops.size(); ++k) {
    const OpProfile& x = a.ops[k];
    const OpProfile& y = b.ops[k];
    if (x.op != y.op || x.call_index != y.call_index || x.output_bytes != y.output_bytes ||
        x.random != y.random || x.inplace != y.inplace || x.view != y.view ||
        x.mutated != y.mutated || x.carries_write != y.carries_write || x.reads != y.reads ||
        x.saved_for_backward != y.saved_for_backward) {
      return false;
    }
  }
  return true;
}

}  // namespace

MemoryProfile with_twins_at_their_fastest(MemoryProfile profile) {
  auto& modules = profile.modules;
  std::vector<bool> grouped(modules.size(), false);
  for (size_t i = 0; i < modules.size(); ++i) {
    if (grouped[i]) continue;
    std::vector<size_t> group{i};
    for (size_t j = i + 1; j < modules.size(); ++j) {
      if (!grouped[j] && same_work(modules[i], modules[j])) group.push_back(j), grouped[j] = true;
    }
    if (group.size() == 1) continue;
    ModuleProfile fastest = modules[i];
    for (size_t j : group) {
      const ModuleProfile& m = modules[j];
      fastest.forward_seconds = std::min(fastest.forward_seconds, m.forward_seconds);
      fastest.selective_forward_seconds =
          std::min(fastest.selective_forward_seconds, m.selective_forward_seconds);
      fastest.replay_seconds = std::min(fastest.replay_seconds, m.replay_seconds);
      for (size_t k = 0; k < m.ops.size(); ++k) {
        fastest.ops[k].seconds = std::min(fastest.ops[k].seconds, m.ops[k].seconds);
      }
    }
    // Backward at the median, not the least: backward times size the copy windows and the step's
    // time beyond them goes to the compute around the modules (the head's backward, the last
    // module's window); the least would move a twin's noise there, the median leaves it out.
    std::vector<double> backward;
    for (size_t j : group) backward.push_back(modules[j].backward_seconds);
    std::sort(backward.begin(), backward.end());
    const size_t mid = backward.size() / 2;
    fastest.backward_seconds =
        backward.size() % 2 ? backward[mid] : (backward[mid - 1] + backward[mid]) / 2;
    for (size_t j : group) {
      ModuleProfile& m = modules[j];
      m.forward_seconds = fastest.forward_seconds;
      m.selective_forward_seconds = fastest.selective_forward_seconds;
      m.replay_seconds = fastest.replay_seconds;
      m.backward_seconds = fastest.backward_seconds;
      for (size_t k = 0; k < m.ops.size(); ++k) m.ops[k].seconds = fastest.ops[k].seconds;
    }
  }
  return profile;
}

}  // namespace recompose::detail
