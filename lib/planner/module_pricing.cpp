#include "module_pricing.h"

#include "keep_rules.h"

#include <algorithm>
#include <stdexcept>

namespace recompose::detail {
namespace {

// Seconds per byte copied, added to every copy's cost: copies the windows hide are never quite
// free (host work, memory traffic), so at equal estimated time keeping beats copying, and a budget
// at or above no checkpointing's bytes gets no checkpointing.
constexpr double kCopyTieBreak = 1e-15;

}  // namespace

ModulePricing::ModulePricing(const ModuleProfile& m, size_t index, const CopyWindowModel* windows)
    : m_(m),
      index_(index),
      windows_(windows),
      replay_(m),
      fixed_(std::max(0.0, m.selective_forward_seconds - m.forward_seconds) + m.replay_seconds) {}

bool ModulePricing::offers(ModuleChoice choice) const {
  switch (choice) {
    case ModuleChoice::Offload:
      return windows_ != nullptr;
    case ModuleChoice::FullSwapInputs:
      // An input a later module takes too stays on the device whatever this module does.
      return windows_ != nullptr && m_.input_bytes > m_.shared_input_bytes;
    default:
      return true;
  }
}

Price ModulePricing::price(ModuleChoice choice) const {
  if (choice == ModuleChoice::Selective)
    throw std::logic_error(
        "recompose: ModulePricing::price: a selective choice needs its keep set");
  const ModuleLoad l = load(choice);
  if (choice != ModuleChoice::Offload && choice != ModuleChoice::FullSwapInputs)
    return {l.held_bytes, l.recompute_seconds};
  if (!windows_)
    throw std::logic_error("recompose: ModulePricing::price: copies need the copy windows");
  // Everything moved crosses the link twice (out and back); only what the windows do not hide
  // costs.
  return {l.held_bytes, l.recompute_seconds +
                            windows_->exposed_seconds(index_, l.offload_bytes, l.offload_copies) +
                            kCopyTieBreak * static_cast<double>(l.offload_bytes)};
}

DropCosts ModulePricing::drop_costs() const {
  const size_t n = m_.ops.size();
  DropCosts d{std::vector<bool>(n, false), std::vector<double>(n, 0.0)};
  // What dropping an op alone costs: its recomputation, if a replay with nothing kept runs it.
  const std::vector<bool> runs_when_all_dropped = replay_.runs(std::vector<bool>(n, false));
  for (size_t k = 0; k < n; ++k)
    d.seconds[k] = runs_when_all_dropped[k] ? std::max(0.0, m_.ops[k].seconds) : 0.0;
  if (!windows_) return d;
  // Offload takes the window, recomputation the rest: ops are swapped, those whose recomputation
  // costs most per byte first, while their copies cost less than recomputing them.
  std::vector<size_t> order;
  for (size_t k = 0; k < n; ++k) {
    if (swappable(m_.ops[k]) && m_.ops[k].output_bytes > 0 && d.seconds[k] > 0) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return d.seconds[a] * static_cast<double>(m_.ops[b].output_bytes) >
           d.seconds[b] * static_cast<double>(m_.ops[a].output_bytes);
  });
  int64_t bytes = 0, copies = 0;
  for (size_t k : order) {
    const int64_t out = m_.ops[k].output_bytes;
    const double before = windows_->exposed_seconds(index_, bytes, copies);
    const double after = windows_->exposed_seconds(index_, bytes + out, copies + 1);
    if (!(after - before < d.seconds[k])) continue;
    d.seconds[k] = after - before + kCopyTieBreak * static_cast<double>(out);
    d.swap[k] = true;
    bytes += out, copies += 1;
  }
  return d;
}

double ModulePricing::selective_seconds(const std::vector<bool>& keep,
                                        const DropCosts* drops) const {
  double seconds = fixed_;
  if (!drops) return seconds + replay_.seconds(keep);
  // The copies of the swapped ops not kept; kept and swapped outputs answer the replay.
  std::vector<bool> answered(keep.size(), false);
  for (size_t k = 0; k < keep.size(); ++k) {
    answered[k] = keep[k] || drops->swap[k];
    if (!keep[k] && drops->swap[k]) seconds += drops->seconds[k];
  }
  if (replay_.walks()) return seconds + replay_.seconds(answered);
  // Without the walk every op not answered runs, its drop cost added op by op: the same seconds
  // as replay_.seconds(answered), in the order the solver has always summed them (another order
  // moves the last bits, and with them the ties between twin modules: which twin gets which
  // configuration).
  for (size_t k = 0; k < keep.size(); ++k) {
    if (!answered[k]) seconds += drops->seconds[k];
  }
  return seconds;
}

Price ModulePricing::selective(const std::vector<bool>& keep, const DropCosts* drops) const {
  int64_t bytes = m_.input_bytes + m_.draw_bytes;
  for (size_t k = 0; k < m_.ops.size(); ++k) {
    if (keep[k]) bytes += m_.ops[k].output_bytes;
  }
  return {bytes, selective_seconds(keep, drops)};
}

ModuleLoad ModulePricing::load(ModuleChoice choice, const std::vector<bool>& kept,
                               const std::vector<bool>& swapped) const {
  ModuleLoad l;
  switch (choice) {
    case ModuleChoice::None:
      l.held_bytes = m_.saved_bytes;
      break;
    case ModuleChoice::Full:
      l.held_bytes = m_.input_bytes;
      l.backward_bytes = std::max<int64_t>(0, m_.saved_bytes - m_.input_bytes);
      l.recompute_seconds = m_.forward_seconds;
      break;
    case ModuleChoice::FullSwapInputs:
      // Inputs a later module takes too stay on the device (ModuleProfile::shared_input_bytes).
      l.held_bytes = m_.shared_input_bytes;
      l.offload_bytes = std::max<int64_t>(0, m_.input_bytes - m_.shared_input_bytes);
      l.offload_copies = 1;
      l.backward_bytes = m_.saved_bytes;
      l.recompute_seconds = m_.forward_seconds;
      break;
    case ModuleChoice::Offload:
      l.held_bytes = m_.shared_input_bytes;
      l.offload_bytes = std::max<int64_t>(0, m_.saved_bytes - m_.shared_input_bytes);
      l.offload_copies = offload_copies(m_);
      break;
    case ModuleChoice::Selective:
      return selective_load(kept, swapped);
  }
  return l;
}

ModuleLoad ModulePricing::selective_load(const std::vector<bool>& kept,
                                         const std::vector<bool>& swapped) const {
  ModuleLoad l;
  l.held_bytes = m_.input_bytes + m_.draw_bytes;
  // The recomputation runs what the replay needs of the ops neither kept nor offloaded.
  std::vector<bool> answered(m_.ops.size(), false);
  for (size_t k = 0; k < m_.ops.size(); ++k) {
    if (kept[k]) {
      l.held_bytes += m_.ops[k].output_bytes;
      answered[k] = true;
    } else if (swapped[k]) {
      l.offload_bytes += m_.ops[k].output_bytes;
      l.offload_copies += 1;
      answered[k] = true;
    }
  }
  l.recompute_seconds = selective_seconds(answered);
  l.backward_bytes = std::max<int64_t>(0, m_.saved_bytes - l.held_bytes - l.offload_bytes);
  return l;
}

}  // namespace recompose::detail
