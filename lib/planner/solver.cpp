// solve_plan(): per module, candidate configurations as (bytes, time) points; the Pareto
// frontier of whole plans, built module by module; a budget takes the frontier's fastest plan
// that fits (recompose/planner.h explains why this is monotone).
#include "copy_window_model.h"
#include "engine/format_bytes.h"
#include "replay_cost.h"
#include "selective/transformer_save_list.h"
#include "twin_modules.h"

#include <recompose/planner.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

namespace recompose {
namespace {

constexpr double kDefaultForcedBandwidth = 1e10;
// The frontier keeps at most one plan per 1/kBuckets of the largest total: solving stays fast
// (modules x candidates x kBuckets) and loses at most that much of a budget.
constexpr int64_t kBuckets = 4096;
// Seconds per byte copied, added to every copy's cost: copies the windows hide are never quite
// free (host work, memory traffic), so at equal estimated time keeping beats copying, and a budget
// at or above no checkpointing's bytes gets no checkpointing.
constexpr double kCopyTieBreak = 1e-15;

struct Point {
  int64_t bytes = 0;
  double seconds = 0;  // extra step time against no checkpointing
  ModuleChoice choice = ModuleChoice::None;
  size_t keep_set = 0;  // Selective: index into ModuleOptions::keep_sets
};

// One module's configurations.
struct ModuleOptions {
  const ModuleProfile* profile = nullptr;
  std::vector<std::vector<bool>> keep_sets;  // Selective: per op, kept or not
  std::vector<bool> swap;     // per op: offloaded rather than recomputed when not kept
  std::vector<Point> points;  // Pareto front, fewest bytes first
};

// The link offload copies cross, or none where the solver may not offload.
std::optional<LinkModel> link_for(const MemoryProfile& profile, const SolveOptions& options) {
  const double given =
      options.copy_bandwidth() > 0 ? options.copy_bandwidth() : profile.copy_bandwidth;
  auto link = [&](double fallback) -> std::optional<LinkModel> {
    if (options.link()) {
      // Measured apart (the profile's inside the profiled process): the copies are likelier to
      // see the slower of the two.
      LinkModel l = *options.link();
      if (profile.copy_bandwidth > 0 && options.copy_bandwidth() <= 0) {
        l.d2h_bytes_per_second = std::min(l.d2h_bytes_per_second, profile.copy_bandwidth);
        l.h2d_bytes_per_second = std::min(l.h2d_bytes_per_second, profile.copy_bandwidth);
      }
      return l;
    }
    if (given > 0) return LinkModel::symmetric(given);
    if (fallback > 0) return LinkModel::symmetric(fallback);
    return std::nullopt;
  };
  switch (options.offload()) {
    case OffloadMode::Never:
      return std::nullopt;
    case OffloadMode::Auto:
      return profile.device.starts_with("cpu") ? std::nullopt : link(0);
    case OffloadMode::Always:
      return link(kDefaultForcedBandwidth);
  }
  return std::nullopt;
}

// An op that only allocates (empty_like: dropout's noise before bernoulli_ draws into it) makes no
// value worth keeping; the draw written into it is random, so its entry would keep a copy of the
// uninitialised memory, and the replay would still write the draw back and divide.
bool allocates_only(const OpProfile& o) {
  return o.op.rfind("aten::empty", 0) == 0 || o.op.rfind("aten::new_empty", 0) == 0;
}

// Kept on the device: an output written in place later only if it carries the write (nothing read
// it before; a copy of the value before the write would cost bytes the profile does not count).
bool keepable(const OpProfile& o) {
  return (!o.mutated || o.carries_write) && !o.inplace && !o.view && !allocates_only(o);
}
// Offloaded: never an output written later (an offloaded output carries no write).
bool swappable(const OpProfile& o) { return keepable(o) && !o.mutated; }

// What transformer_policy keeps (its own list): its configurations are candidates too, so that a
// plan is never estimated slower than that fixed policy.
bool kept_by_transformer_policy(const std::string& op) {
  return std::ranges::find(detail::transformer_save_list(), std::string_view(op)) !=
         detail::transformer_save_list().end();
}

// What transformer_policy keeps of module `m` (every_second: with every second aten::mm
// recomputed, TransformerPolicyOptions::recompute_every_second_mm), per op.
std::vector<bool> transformer_keep_set(const ModuleProfile& m, bool every_second) {
  std::vector<bool> keep(m.ops.size(), false);
  for (size_t k = 0; k < m.ops.size(); ++k) {
    const OpProfile& o = m.ops[k];
    keep[k] = keepable(o) && kept_by_transformer_policy(o.op) &&
              !(every_second && o.op == "aten::mm.default" && o.call_index % 2 == 1);
  }
  return keep;
}

// Keep sets grown one op at a time, the op that saves the most time per byte of its outputs first.
// With the replay's dependency walk an op saves what the keep set's cost drops by when it is added
// (the ops only it needed stop running too; an op nothing needs saves nothing and is never kept);
// without it, its own cost. O(ops^2) evaluations of `seconds_of`, each O(ops + reads).
template <class SecondsOf, class Add>
void add_greedy_keep_sets(const ModuleProfile& m, const std::vector<double>& cost, bool walks,
                          SecondsOf& seconds_of, std::vector<bool>& keep, Add& add) {
  const size_t n = m.ops.size();
  std::vector<size_t> open;
  for (size_t k = 0; k < n; ++k) {
    if (keepable(m.ops[k]) && (walks || cost[k] > 0)) open.push_back(k);
  }
  auto bytes = [&](size_t k) { return static_cast<double>(m.ops[k].output_bytes); };
  while (!open.empty()) {
    const double now = walks ? seconds_of(keep) : 0.0;
    size_t best = open.size();
    double best_saving = 0;
    for (size_t i = 0; i < open.size(); ++i) {
      const size_t k = open[i];
      double saving = cost[k];
      if (walks) {
        keep[k] = true;
        saving = now - seconds_of(keep);
        keep[k] = false;
      }
      if (!(saving > 0)) continue;
      // More saved per byte (an op of no bytes first); the earlier op on a tie.
      if (best == open.size() || saving * bytes(open[best]) > best_saving * bytes(k)) {
        best = i, best_saving = saving;
      }
    }
    if (best == open.size()) return;
    keep[open[best]] = true;
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(best));
    add(keep);
  }
}

// Module `m` not checkpointed: it holds what its forward saves, for no extra time.
Point none_point(const ModuleProfile& m) { return {m.saved_bytes, 0.0, ModuleChoice::None, 0}; }

// Module `m` fully checkpointed: it holds its inputs, for its forward run again.
Point full_point(const ModuleProfile& m) {
  return {m.input_bytes, m.forward_seconds, ModuleChoice::Full, 0};
}

// Module `index` offloaded whole: it holds only the inputs a later module takes too, for what its
// copies expose.
Point offload_point(const ModuleProfile& m, size_t index, const detail::CopyWindowModel& windows) {
  const int64_t moved = std::max<int64_t>(0, m.saved_bytes - m.shared_input_bytes);
  return {m.shared_input_bytes,
          windows.exposed_seconds(index, moved, detail::offload_copies(m)) +
              kCopyTieBreak * static_cast<double>(moved),
          ModuleChoice::Offload, 0};
}

// Module `index`'s candidates; `windows` (null: no offload) prices copies by what their windows
// do not hide.
void add_candidates(const ModuleProfile& m, size_t index, const detail::CopyWindowModel* windows,
                    bool offload, ModuleOptions& mo) {
  std::vector<Point> points{none_point(m), full_point(m)};
  // Everything the forward saves crosses the link twice (out and back). What it holds while its
  // own forward runs is counted once per plan (Family::base_bytes).
  // An input a later module takes too stays on the device whatever this module does.
  const int64_t shared = m.shared_input_bytes;
  if (offload) points.push_back(offload_point(m, index, *windows));
  // Full checkpointing whose inputs wait in host memory: nothing held (but the shared inputs),
  // for a recomputation and what the inputs' two copies expose.
  if (windows && m.input_bytes > shared) {
    const int64_t moved = m.input_bytes - shared;
    points.push_back({shared,
                      m.forward_seconds + windows->exposed_seconds(index, moved, 1) +
                          kCopyTieBreak * static_cast<double>(moved),
                      ModuleChoice::FullSwapInputs, 0});
  }

  // Selective: the fixed cost is the interception in the forward and the replay in backward; an
  // op not kept costs its two copies where it is offloaded, and its recomputation where the
  // replay runs it (replay_cost.h: only what backward needs).
  const size_t n = m.ops.size();
  mo.swap.assign(n, false);
  const detail::ReplayCost replay(m);
  const double fixed =
      std::max(0.0, m.selective_forward_seconds - m.forward_seconds) + m.replay_seconds;
  // What dropping an op alone costs: its recomputation, if a replay with nothing kept runs it;
  // offloaded ops take their copies' cost instead.
  const std::vector<bool> runs_when_all_dropped = replay.runs(std::vector<bool>(n, false));
  std::vector<double> cost(n, 0.0);
  for (size_t k = 0; k < n; ++k)
    cost[k] = runs_when_all_dropped[k] ? std::max(0.0, m.ops[k].seconds) : 0.0;
  if (windows) {
    // Offload takes the window, recomputation the rest: ops are swapped, those whose
    // recomputation costs most per byte first, while their copies cost less than recomputing
    // them (nothing while they fit in the module's windows).
    std::vector<size_t> order;
    for (size_t k = 0; k < n; ++k) {
      if (swappable(m.ops[k]) && m.ops[k].output_bytes > 0 && cost[k] > 0) order.push_back(k);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return cost[a] * static_cast<double>(m.ops[b].output_bytes) >
             cost[b] * static_cast<double>(m.ops[a].output_bytes);
    });
    int64_t bytes = 0, copies = 0;
    for (size_t k : order) {
      const double before = windows->exposed_seconds(index, bytes, copies);
      const double after =
          windows->exposed_seconds(index, bytes + m.ops[k].output_bytes, copies + 1);
      if (!(after - before < cost[k])) continue;
      cost[k] = after - before + kCopyTieBreak * static_cast<double>(m.ops[k].output_bytes),
      mo.swap[k] = true;
      bytes += m.ops[k].output_bytes, copies += 1;
    }
  }
  // A keep set's extra seconds: the fixed cost, the copies of the offloaded ops not kept, the ops
  // the replay runs (kept and offloaded outputs answer it).
  std::vector<bool> answered(n, false);
  auto seconds_of = [&](const std::vector<bool>& keep) {
    double seconds = fixed;
    for (size_t k = 0; k < n; ++k) {
      answered[k] = keep[k] || mo.swap[k];
      if (!keep[k] && mo.swap[k]) seconds += cost[k];
    }
    if (replay.walks()) return seconds + replay.seconds(answered);
    for (size_t k = 0; k < n; ++k) {
      if (!answered[k]) seconds += cost[k];
    }
    return seconds;
  };
  auto add_selective = [&](std::vector<bool> keep) {
    int64_t bytes = m.input_bytes + m.draw_bytes;
    for (size_t k = 0; k < n; ++k) {
      if (keep[k]) bytes += m.ops[k].output_bytes;
    }
    points.push_back({bytes, seconds_of(keep), ModuleChoice::Selective, mo.keep_sets.size()});
    mo.keep_sets.push_back(std::move(keep));
  };
  std::vector<bool> keep(n, false);
  // Nothing kept and nothing swapped is full checkpointing plus the interception: not a candidate.
  if (std::find(mo.swap.begin(), mo.swap.end(), true) != mo.swap.end()) add_selective(keep);
  add_greedy_keep_sets(m, cost, replay.walks(), seconds_of, keep, add_selective);
  // Partial offload: what fits the windows swapped, everything else kept.
  if (std::find(mo.swap.begin(), mo.swap.end(), true) != mo.swap.end()) {
    std::vector<bool> rest(n, false);
    for (size_t k = 0; k < n; ++k) rest[k] = keepable(m.ops[k]) && !mo.swap[k];
    add_selective(std::move(rest));
  }
  // The transformer policy, and its variant recomputing every second aten::mm.
  for (bool every_second : {false, true}) add_selective(transformer_keep_set(m, every_second));

  // Pareto front: more bytes must buy less time.
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return std::tie(a.bytes, a.seconds) < std::tie(b.bytes, b.seconds);
  });
  for (const Point& p : points) {
    if (mo.points.empty() || p.seconds < mo.points.back().seconds) mo.points.push_back(p);
  }
}

std::vector<ModuleOptions> module_options(const MemoryProfile& profile,
                                          const detail::CopyWindowModel* windows, bool offload) {
  if (profile.modules.empty())
    throw std::invalid_argument("recompose: solve_plan: the profile has no module");
  std::vector<ModuleOptions> out(profile.modules.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].profile = &profile.modules[i];
    add_candidates(profile.modules[i], i, windows, offload, out[i]);
  }
  return out;
}

// A whole plan on the frontier: its totals and how it was made (for the walk back).
struct Node {
  int64_t bytes;
  double seconds;
  int32_t parent;  // index in the previous module's frontier
  int32_t point;   // index in this module's points
};

// The frontier after each module: plans of modules 0..i, Pareto-optimal (sorted by bytes, time
// strictly falling), thinned to one plan per bucket. Built the same way for every budget, so a
// budget only picks a point of the last one.
// Plans with and plans without offloaded modules: an offloaded module holds what it saves until
// its call ends (the copies start then), so a plan with offload holds, at its peak, up to the
// largest module's saved bytes on top of the rest. Each family is solved with that in its base.
struct Family {
  std::vector<ModuleOptions> modules;
  int64_t base_bytes = 0;
  // The frontier after each module: plans of modules 0..i, Pareto-optimal (sorted by bytes, time
  // strictly falling), thinned to one plan per bucket. Built the same way for every budget.
  std::vector<std::vector<Node>> fronts;
};

void build_frontiers(Family& family, int64_t bucket) {
  std::vector<Node> current{{family.base_bytes, 0.0, -1, -1}};
  std::vector<Node> next;
  for (const auto& mo : family.modules) {
    next.clear();
    for (size_t f = 0; f < current.size(); ++f) {
      for (size_t k = 0; k < mo.points.size(); ++k) {
        next.push_back({current[f].bytes + mo.points[k].bytes,
                        current[f].seconds + mo.points[k].seconds, static_cast<int32_t>(f),
                        static_cast<int32_t>(k)});
      }
    }
    std::sort(next.begin(), next.end(), [](const Node& a, const Node& b) {
      return std::tie(a.bytes, a.seconds, a.parent, a.point) <
             std::tie(b.bytes, b.seconds, b.parent, b.point);
    });
    std::vector<Node> front;
    for (const Node& n : next) {
      if (!front.empty() && n.seconds >= front.back().seconds) continue;  // dominated
      // Same bucket as the last kept plan (not the first plan): the faster one stays.
      if (front.size() > 1 && n.bytes / bucket == front.back().bytes / bucket) front.pop_back();
      front.push_back(n);
    }
    family.fronts.push_back(front);
    current = std::move(front);
  }
}

// The copy-window model copies are priced on, or none where the solver may not offload.
std::optional<detail::CopyWindowModel> windows_for(const MemoryProfile& profile,
                                                   const SolveOptions& options) {
  const auto link = link_for(profile, options);
  if (!link) return std::nullopt;
  return detail::CopyWindowModel(detail::step_compute_of(profile), *link,
                                 options.max_groups_in_flight());
}

// The largest bytes a module saves: what a plan offloading modules holds on top of the rest.
int64_t largest_saved(const MemoryProfile& profile) {
  int64_t largest = 0;
  for (const auto& m : profile.modules) largest = std::max(largest, m.saved_bytes);
  return largest;
}

// Without a link: one family, no copies. With one: no copies; swaps of single ops; and module
// offload as well. The no-copy family is solved on its own so that its plans stay candidates
// where a plan with copies holds fewer bytes for the same estimate but stalls or peaks higher.
std::vector<Family> families(const MemoryProfile& profile, const detail::CopyWindowModel* w) {
  std::vector<Family> out(w ? 3 : 1);
  out[0].modules = module_options(profile, nullptr, false);
  out[0].base_bytes = profile.other_bytes;
  if (w) {
    out[1].modules = module_options(profile, w, false);
    out[1].base_bytes = profile.other_bytes;
    out[2].modules = module_options(profile, w, true);
    out[2].base_bytes = profile.other_bytes + largest_saved(profile);
  }
  int64_t most = profile.other_bytes;
  for (const auto& m : profile.modules) most += std::max(m.saved_bytes, m.input_bytes);
  const int64_t bucket = std::max<int64_t>(1, most / kBuckets);
  for (auto& f : out) build_frontiers(f, bucket);
  return out;
}

// The final frontier: the last frontiers of all families, merged and Pareto-filtered.
struct Final {
  int64_t bytes;
  double seconds;
  size_t family, node;
};

std::vector<Final> final_frontier(const std::vector<Family>& fams) {
  std::vector<Final> all;
  for (size_t f = 0; f < fams.size(); ++f) {
    const auto& last = fams[f].fronts.back();
    for (size_t i = 0; i < last.size(); ++i) all.push_back({last[i].bytes, last[i].seconds, f, i});
  }
  std::sort(all.begin(), all.end(), [](const Final& a, const Final& b) {
    return std::tie(a.bytes, a.seconds, a.family, a.node) <
           std::tie(b.bytes, b.seconds, b.family, b.node);
  });
  std::vector<Final> out;
  for (const Final& x : all) {
    if (out.empty() || x.seconds < out.back().seconds) out.push_back(x);
  }
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

// What a plan is judged by: the simulated step and peak on the link, with the swap manager's
// throttle, and the allocator's share of a peak budget.
struct Judge {
  const MemoryProfile& profile;
  LinkModel link;
  int64_t max_groups_in_flight = 2;
  double headroom = 0;  // allocator_headroom on a device; 0 on CPU (no caching allocator)

  // Fills plan.peak_bytes, and makes plan.step_seconds (the modules' costs added up) at least
  // the simulated step: the added-up costs give each module's copies back the next module's
  // backward, which the swap manager's prefetch gives only where that module offloads too.
  void finish(Plan& plan) const {
    const detail::SimulatedStep s =
        detail::simulate_plan(profile, plan, link, max_groups_in_flight);
    plan.peak_bytes = profile.resident_bytes + s.peak_bytes;
    plan.step_seconds = std::max(plan.step_seconds, s.seconds);
  }
  // What a plan needs of a peak budget: its simulated peak, and where it swaps the largest
  // module's offloaded bytes, which come back into blocks cached for the copy stream.
  int64_t needs(const Plan& plan) const {
    int64_t pool = 0;
    if (headroom > 0) {
      for (const auto& l : detail::module_loads(profile, plan))
        pool = std::max(pool, l.offload_bytes);
    }
    return plan.peak_bytes + pool;
  }
  // What of a peak budget a plan may need: the rest is the allocator's headroom.
  int64_t usable(int64_t peak) const {
    return peak - static_cast<int64_t>(std::ceil(headroom * static_cast<double>(peak)));
  }
  // The least peak budget whose usable part covers `need`.
  int64_t least_budget(int64_t need) const {
    if (headroom <= 0) return need;
    auto b = static_cast<int64_t>(std::ceil(static_cast<double>(need) / (1.0 - headroom)));
    while (usable(b) < need) ++b;
    while (b > need && usable(b - 1) >= need) --b;
    return b;
  }
};

Judge judge_of(const MemoryProfile& profile, const SolveOptions& options) {
  if (!(options.allocator_headroom() >= 0 && options.allocator_headroom() < 1)) {
    throw std::invalid_argument(
        "recompose: solve_plan: allocator_headroom must be in [0, 1), got " +
        std::to_string(options.allocator_headroom()));
  }
  if (options.max_groups_in_flight() < 0) {
    throw std::invalid_argument("recompose: solve_plan: max_groups_in_flight must not be negative");
  }
  // Plans without copies simulate the same on any link.
  return {profile,
          link_for(profile, options).value_or(LinkModel::symmetric(kDefaultForcedBandwidth)),
          options.max_groups_in_flight(),
          profile.device.starts_with("cpu") ? 0.0 : options.allocator_headroom()};
}

// A plan for `limit` with no module yet: what every candidate says of the profile it came from.
Plan plan_for(const MemoryProfile& profile, int64_t limit) {
  Plan plan;
  plan.budget_bytes = limit;
  plan.none_bytes = profile.bytes_held;
  plan.none_step_seconds = profile.step_seconds;
  plan.backward_measured = profile.backward_measured();
  return plan;
}

// The plan of one frontier point, its simulated peak and step included.
Plan plan_at(const MemoryProfile& profile, const std::vector<Family>& fams, const Final& chosen,
             int64_t limit, const Judge& judge) {
  const Family& fam = fams[chosen.family];
  Plan plan = plan_for(profile, limit);
  plan.bytes = chosen.bytes;
  plan.step_seconds = profile.step_seconds + chosen.seconds;
  plan.modules.resize(fam.modules.size());
  size_t at = chosen.node;
  for (size_t i = fam.modules.size(); i-- > 0;) {
    const Node& n = fam.fronts[i][at];
    plan.modules[i] =
        module_plan(fam.modules[i], fam.modules[i].points[static_cast<size_t>(n.point)]);
    at = static_cast<size_t>(n.parent);
  }
  judge.finish(plan);
  return plan;
}

// A module's plan entry with no op listed.
ModulePlan module_entry(const ModuleProfile& m, ModuleChoice choice, int64_t bytes,
                        double seconds) {
  ModulePlan mp;
  mp.name = m.name;
  mp.type = m.type;
  mp.choice = choice;
  mp.bytes = bytes;
  mp.seconds = seconds;
  return mp;
}

// Every module under transformer_policy's list (every_second: with every second aten::mm
// recomputed), nothing swapped: the fixed policy a user would try first, a candidate whatever the
// frontier's thinning and the peak walk left.
Plan transformer_everywhere(const MemoryProfile& profile, int64_t limit, const Judge& judge,
                            bool every_second = false) {
  Plan plan = plan_for(profile, limit);
  plan.bytes = profile.other_bytes;
  plan.step_seconds = profile.step_seconds;
  for (const ModuleProfile& m : profile.modules) {
    const std::vector<bool> keep = transformer_keep_set(m, every_second);
    // As add_candidates prices a keep set with nothing swapped.
    ModulePlan mp = module_entry(m, ModuleChoice::Selective, m.input_bytes + m.draw_bytes,
                                 std::max(0.0, m.selective_forward_seconds - m.forward_seconds) +
                                     m.replay_seconds + detail::ReplayCost(m).seconds(keep));
    for (size_t k = 0; k < m.ops.size(); ++k) {
      if (!keep[k]) continue;
      mp.save.push_back({m.ops[k].op, m.ops[k].call_index});
      mp.bytes += m.ops[k].output_bytes;
    }
    plan.bytes += mp.bytes;
    plan.step_seconds += mp.seconds;
    plan.modules.push_back(std::move(mp));
  }
  judge.finish(plan);
  return plan;
}

// Every module under one choice (None, Full or Offload; Offload needs `windows`), priced as the
// solver prices it.
Plan uniform_plan(const MemoryProfile& profile, int64_t limit, const Judge& judge,
                  ModuleChoice choice, const detail::CopyWindowModel* windows) {
  Plan plan = plan_for(profile, limit);
  // As the offload family's base: an offloaded module holds what it saves until its call ends.
  plan.bytes = profile.other_bytes + (choice == ModuleChoice::Offload ? largest_saved(profile) : 0);
  plan.step_seconds = profile.step_seconds;
  for (size_t i = 0; i < profile.modules.size(); ++i) {
    const ModuleProfile& m = profile.modules[i];
    const Point p = choice == ModuleChoice::None   ? none_point(m)
                    : choice == ModuleChoice::Full ? full_point(m)
                                                   : offload_point(m, i, *windows);
    plan.modules.push_back(module_entry(m, choice, p.bytes, p.seconds));
    plan.bytes += p.bytes;
    plan.step_seconds += p.seconds;
  }
  judge.finish(plan);
  return plan;
}

// Where a plan's simulated peak falls, in words, for an error message.
std::string where_peak_falls(const MemoryProfile& profile, const Plan& plan, const Judge& judge) {
  const detail::SimulatedStep s =
      detail::simulate_plan(profile, plan, judge.link, judge.max_groups_in_flight);
  if (s.peak_module < 0 || static_cast<size_t>(s.peak_module) >= profile.modules.size()) {
    return s.peak_in_backward ? "when backward starts, with everything the forward keeps held"
                              : "before the first module";
  }
  const ModuleProfile& m = profile.modules[static_cast<size_t>(s.peak_module)];
  return std::string(s.peak_in_backward ? "in the backward of module '"
                                        : "in the forward of module '") +
         m.name + "' (" + m.type + ")";
}

// What the profile's resident bytes stand for, in an error message.
std::string resident_in_words(const MemoryProfile& profile) {
  return profile.device == "cpu" ? " (on CPU, where no allocator peak is measured, the model's "
                                   "parameters, gradients and "
                                   "buffers only)"
                                 : " (weights, gradients, optimizer state, temporaries)";
}

constexpr const char* kFamilyNames[] = {"solver (no copies)", "solver (swaps)", "solver (offload)"};

// The candidates a budget chooses from: per family, the fastest frontier plan within `limit`
// bytes whose peak fits (`peak`; none: no peak budget); and transformer_everywhere. `least` gets
// the plan needing the least of a peak budget seen.
std::vector<PlanCandidate> candidates(const MemoryProfile& profile, const std::vector<Family>& fams,
                                      int64_t limit, std::optional<int64_t> peak,
                                      const Judge& judge, std::optional<Plan>& least) {
  std::vector<PlanCandidate> out;
  auto seen = [&](const Plan& p) {
    if (!least || judge.needs(p) < judge.needs(*least)) least = p;
    return !peak || judge.needs(p) <= judge.usable(*peak);
  };
  // The plan without copies first: on equal estimates it is the one chosen.
  for (size_t f = 0; f < fams.size(); ++f) {
    const auto& last = fams[f].fronts.back();
    auto it = std::upper_bound(last.begin(), last.end(), limit,
                               [](int64_t b, const Node& n) { return b < n.bytes; });
    // Down the frontier the added-up estimate grows, and a plan's estimate is at least it: once
    // it reaches the best estimate found, no plan further down is faster. So this is the fastest
    // fitting plan of the family, and a larger budget (more plans fit) never gives a slower one.
    std::optional<Plan> best;
    for (auto i = static_cast<size_t>(it - last.begin()); i-- > 0;) {
      if (best && profile.step_seconds + last[i].seconds >= best->step_seconds) break;
      Plan p = plan_at(profile, fams, {last[i].bytes, last[i].seconds, f, i}, limit, judge);
      if (seen(p) && (!best || p.step_seconds < best->step_seconds)) best = std::move(p);
    }
    if (best) out.push_back({kFamilyNames[f], std::move(*best)});
    if (f == 0) {
      Plan t = transformer_everywhere(profile, limit, judge);
      if (t.bytes <= limit && seen(t)) out.push_back({"transformer_policy", std::move(t)});
    }
  }
  return out;
}

// One solve for one budget: the profile (twins at their fastest), the families' frontiers and
// the candidates that fit; the errors solve_plan and candidate_plans share. Not copyable: the
// judge refers to the profile.
struct Solve {
  Solve(const MemoryProfile& measured, const Budget& budget, const SolveOptions& options);
  Solve(const Solve&) = delete;
  Solve& operator=(const Solve&) = delete;

  // Within the budget: its bytes, and a peak budget's usable part.
  bool fits(const Plan& p) const {
    return p.bytes <= limit && (!peak || judge.needs(p) <= judge.usable(*peak));
  }

  MemoryProfile profile;
  Judge judge;
  std::optional<detail::CopyWindowModel> windows;
  std::vector<Family> fams;
  int64_t limit = 0;
  std::optional<int64_t> peak;
  // Per family the fastest fitting frontier plan, and transformer_policy everywhere if it fits;
  // never empty.
  std::vector<PlanCandidate> fitting;
};

Solve::Solve(const MemoryProfile& measured, const Budget& budget, const SolveOptions& options)
    : profile(detail::with_twins_at_their_fastest(measured)),
      judge(judge_of(profile, options)),
      windows(windows_for(profile, options)),
      fams(families(profile, windows ? &*windows : nullptr)),
      limit(budget.resolve(profile)) {
  const auto frontier = final_frontier(fams);
  if (budget.is_peak() && frontier.front().bytes > limit) {
    throw std::invalid_argument(
        "recompose: solve_plan: a peak of " + detail::format_mib(limit + profile.resident_bytes) +
        " leaves " + detail::format_mib(limit) + " for activations beside the profile's resident " +
        detail::format_mib(profile.resident_bytes) + resident_in_words(profile) +
        ", below the least any plan holds, " + detail::format_mib(frontier.front().bytes) +
        " (min_plan_peak_bytes gives the least feasible peak)");
  }
  if (frontier.front().bytes > limit) {
    throw std::invalid_argument(
        "recompose: solve_plan: a budget of " + detail::format_mib(limit, /*exact=*/true) +
        " is below the least any plan holds, " +
        detail::format_mib(frontier.front().bytes, /*exact=*/true) + " (" +
        (fams.size() > 1 ? "offload or full checkpointing" : "full checkpointing") +
        " of every module)");
  }
  if (budget.is_peak()) peak = limit + profile.resident_bytes;
  std::optional<Plan> least;
  fitting = candidates(profile, fams, limit, peak, judge, least);
  if (!fitting.empty()) return;
  // Only a peak budget gets here: within the bytes, a plan exists.
  const std::string headroom =
      judge.headroom > 0
          ? " less the caching allocator's headroom (SolveOptions::allocator_headroom, " +
                std::to_string(static_cast<int>(std::lround(judge.headroom * 100))) +
                "%: " + detail::format_mib(*peak - judge.usable(*peak)) + ")"
          : std::string();
  throw std::invalid_argument(
      "recompose: solve_plan: a peak of " + detail::format_mib(*peak) + headroom +
      " is below the least simulated peak of any plan, " + detail::format_mib(least->peak_bytes) +
      " (min_plan_peak_bytes gives the least budget), of which resident " +
      detail::format_mib(profile.resident_bytes) + resident_in_words(profile) +
      "; that plan's peak falls " + where_peak_falls(profile, *least, judge));
}

// The fixed presets, each estimated, in candidate_plans' order (offload where copies are priced).
std::vector<PlanCandidate> presets(const Solve& s) {
  std::vector<PlanCandidate> out;
  const detail::CopyWindowModel* w = s.windows ? &*s.windows : nullptr;
  out.push_back({"none", uniform_plan(s.profile, s.limit, s.judge, ModuleChoice::None, w)});
  out.push_back({"full", uniform_plan(s.profile, s.limit, s.judge, ModuleChoice::Full, w)});
  out.push_back({"transformer_policy", transformer_everywhere(s.profile, s.limit, s.judge)});
  out.push_back({"every second mm", transformer_everywhere(s.profile, s.limit, s.judge, true)});
  if (w)
    out.push_back({"offload", uniform_plan(s.profile, s.limit, s.judge, ModuleChoice::Offload, w)});
  return out;
}

// The same configuration: per module the same choice, kept and swapped ops.
bool same_configuration(const Plan& a, const Plan& b) {
  return std::ranges::equal(a.modules, b.modules, [](const ModulePlan& x, const ModulePlan& y) {
    return x.name == y.name && x.choice == y.choice && x.save == y.save && x.swap == y.swap;
  });
}

double solving_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t min_plan_bytes(const MemoryProfile& profile, const SolveOptions& options) {
  const auto windows = windows_for(profile, options);
  return final_frontier(families(profile, windows ? &*windows : nullptr)).front().bytes;
}

int64_t min_plan_peak_bytes(const MemoryProfile& measured, const SolveOptions& options) {
  const MemoryProfile profile = detail::with_twins_at_their_fastest(measured);
  const Judge judge = judge_of(profile, options);
  const auto windows = windows_for(profile, options);
  const auto fams = families(profile, windows ? &*windows : nullptr);
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t f = 0; f < fams.size(); ++f) {
    const auto& last = fams[f].fronts.back();
    for (size_t i = 0; i < last.size(); ++i) {
      const Plan p =
          plan_at(profile, fams, {last[i].bytes, last[i].seconds, f, i}, last[i].bytes, judge);
      least = std::min(least, judge.needs(p));
    }
  }
  const Plan t = transformer_everywhere(profile, 0, judge);
  least = std::min(least, judge.needs(t));
  return judge.least_budget(least);
}

Plan solve_plan(const MemoryProfile& measured, const Budget& budget, const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Solve s(measured, budget, options);
  // The fastest estimate; the first (no copies) on a tie.
  auto best = std::min_element(s.fitting.begin(), s.fitting.end(),
                               [](const PlanCandidate& a, const PlanCandidate& b) {
                                 return a.plan.step_seconds < b.plan.step_seconds;
                               });
  Plan plan = std::move(best->plan);
  plan.solve_seconds = solving_seconds_since(t0);
  return plan;
}

std::vector<PlanCandidate> candidate_plans(const MemoryProfile& measured, const Budget& budget,
                                           const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Solve s(measured, budget, options);
  // Each with whether solve_plan weighs it (a family's plan, transformer_policy).
  std::vector<std::pair<PlanCandidate, bool>> all;
  for (auto& c : s.fitting) {
    if (c.name != std::string("transformer_policy")) all.push_back({std::move(c), true});
  }
  for (auto& c : presets(s)) {
    const bool weighed = c.name == "transformer_policy";
    if (s.fits(c.plan)) all.push_back({std::move(c), weighed});
  }
  std::vector<PlanCandidate> out;
  std::vector<bool> weighed;
  for (auto& [c, w] : all) {
    auto same = std::ranges::find_if(
        out, [&](const PlanCandidate& o) { return same_configuration(o.plan, c.plan); });
    if (same == out.end()) {
      out.push_back(std::move(c));
      weighed.push_back(w);
    } else if (w && weighed[static_cast<size_t>(same - out.begin())] &&
               c.plan.step_seconds < same->plan.step_seconds) {
      // One configuration reached two ways (a frontier's sums, transformer_policy's) may differ in
      // the last bits: solve_plan's estimate, the faster.
      same->plan = std::move(c.plan);
    }
  }
  // Fastest first; on a tie, the order above.
  std::stable_sort(out.begin(), out.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.plan.step_seconds < b.plan.step_seconds;
  });
  const double took = solving_seconds_since(t0);
  for (auto& c : out) c.plan.solve_seconds = took;
  return out;
}

}  // namespace recompose
