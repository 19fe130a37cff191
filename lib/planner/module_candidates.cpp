#include "module_candidates.h"

#include "keep_rules.h"
#include "module_pricing.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace recompose::detail {
namespace {

// Keep sets grown one op at a time, the op that saves the most time per byte of its outputs first,
// each step's set in order. With the replay's dependency walk an op saves what the keep set's cost
// drops by when it is added (the ops only it needed stop running too; an op nothing needs saves
// nothing and is never kept); without it, its own cost. O(ops^2) priced keep sets, each
// O(ops + reads).
std::vector<std::vector<bool>> greedy_keep_sets(const ModulePricing& pricing,
                                                const DropCosts& drops) {
  const ModuleProfile& m = pricing.module();
  const bool walks = pricing.walks();
  const std::vector<double>& cost = drops.seconds;
  std::vector<size_t> open;
  for (size_t k = 0; k < m.ops.size(); ++k) {
    if (keepable(m.ops[k]) && (walks || cost[k] > 0)) open.push_back(k);
  }
  auto bytes = [&](size_t k) { return static_cast<double>(m.ops[k].output_bytes); };
  std::vector<bool> keep(m.ops.size(), false);
  std::vector<std::vector<bool>> out;
  while (!open.empty()) {
    const double now = walks ? pricing.selective_seconds(keep, &drops) : 0.0;
    size_t best = open.size();
    double best_saving = 0;
    for (size_t i = 0; i < open.size(); ++i) {
      const size_t k = open[i];
      double saving = cost[k];
      if (walks) {
        keep[k] = true;
        saving = now - pricing.selective_seconds(keep, &drops);
        keep[k] = false;
      }
      if (!(saving > 0)) continue;
      // More saved per byte (an op of no bytes first); the earlier op on a tie.
      if (best == open.size() || saving * bytes(open[best]) > best_saving * bytes(k)) {
        best = i, best_saving = saving;
      }
    }
    if (best == open.size()) break;
    keep[open[best]] = true;
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(best));
    out.push_back(keep);
  }
  return out;
}

// The selective candidates: the fixed cost is the interception in the forward and the replay in
// backward; an op not kept costs its two copies where it is swapped, and its recomputation where
// the replay runs it (replay_cost.h: only what backward needs).
void add_selective(const ModulePricing& pricing, std::vector<Point>& points, ModuleOptions& mo) {
  const ModuleProfile& m = pricing.module();
  const size_t n = m.ops.size();
  const DropCosts drops = pricing.drop_costs();
  mo.swap = drops.swap;
  auto add = [&](std::vector<bool> keep) {
    const Price p = pricing.selective(keep, &drops);
    points.push_back({p.bytes, p.seconds, ModuleChoice::Selective, mo.keep_sets.size()});
    mo.keep_sets.push_back(std::move(keep));
  };
  const bool swaps = std::find(mo.swap.begin(), mo.swap.end(), true) != mo.swap.end();
  // Nothing kept and nothing swapped is full checkpointing plus the interception: not a candidate.
  if (swaps) add(std::vector<bool>(n, false));
  for (auto& keep : greedy_keep_sets(pricing, drops)) add(std::move(keep));
  // Partial offload: what fits the windows swapped, everything else kept.
  if (swaps) {
    std::vector<bool> rest(n, false);
    for (size_t k = 0; k < n; ++k) rest[k] = keepable(m.ops[k]) && !mo.swap[k];
    add(std::move(rest));
  }
  // The transformer policy, and its variant recomputing every second aten::mm.
  for (bool every_second : {false, true}) add(transformer_keep_set(m, every_second));
}

// Pareto front: more bytes must buy less time.
std::vector<Point> pareto_front(std::vector<Point> points) {
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return std::tie(a.bytes, a.seconds) < std::tie(b.bytes, b.seconds);
  });
  std::vector<Point> front;
  for (const Point& p : points) {
    if (front.empty() || p.seconds < front.back().seconds) front.push_back(p);
  }
  return front;
}

// Module `index`'s candidates; `windows` (null: no copies) prices copies by what their windows do
// not hide. Offload is offered with `offload` only: its plans hold, at their peak, a module's
// saved bytes on top (Family::base_bytes).
ModuleOptions candidates_of(const ModuleProfile& m, size_t index, const CopyWindowModel* windows,
                            bool offload) {
  const ModulePricing pricing(m, index, windows);
  std::vector<Point> points;
  for (ModuleChoice c : {ModuleChoice::None, ModuleChoice::Full, ModuleChoice::Offload,
                         ModuleChoice::FullSwapInputs}) {
    if (!pricing.offers(c) || (c == ModuleChoice::Offload && !offload)) continue;
    const Price p = pricing.price(c);
    points.push_back({p.bytes, p.seconds, c, 0});
  }
  ModuleOptions mo;
  mo.profile = &m;
  add_selective(pricing, points, mo);
  mo.points = pareto_front(std::move(points));
  return mo;
}

}  // namespace

std::vector<ModuleOptions> module_options(const MemoryProfile& profile,
                                          const CopyWindowModel* windows, bool offload) {
  if (profile.modules.empty())
    throw std::invalid_argument("recompose: solve_plan: the profile has no module");
  std::vector<ModuleOptions> out;
  for (size_t i = 0; i < profile.modules.size(); ++i)
    out.push_back(candidates_of(profile.modules[i], i, windows, offload));
  return out;
}

ModulePlan module_plan(const ModuleOptions& mo, const Point& p) {
  const ModuleProfile& m = *mo.profile;
  ModulePlan plan;
  plan.name = m.name;
  plan.type = m.type;
  plan.choice = p.choice;
  plan.bytes = p.bytes;
  plan.seconds = p.seconds;
  if (p.choice != ModuleChoice::Selective) return plan;
  const auto& keep = mo.keep_sets[p.keep_set];
  for (size_t k = 0; k < m.ops.size(); ++k) {
    if (keep[k])
      plan.save.push_back({m.ops[k].op, m.ops[k].call_index});
    else if (mo.swap[k])
      plan.swap.push_back({m.ops[k].op, m.ops[k].call_index});
  }
  return plan;
}

}  // namespace recompose::detail
