// solve_plan(): per module, candidate configurations as (bytes, time) points; their lower convex
// hulls give upgrades; all upgrades merged by time saved per byte; a budget takes the longest
// prefix that fits (recompose/planner.h explains why this is monotone).
#include <recompose/planner.h>

#include <algorithm>
#include <chrono>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>

namespace recompose {
namespace {

constexpr double kDefaultForcedBandwidth = 1e10;

struct Point {
  int64_t bytes = 0;
  double seconds = 0;  // extra step time against no checkpointing
  ModuleChoice choice = ModuleChoice::None;
  size_t kept = 0;  // Selective: how many ops of the module's ranking are kept
};

// One module's options, and the ops of its forward ranked for keeping.
struct ModuleOptions {
  const ModuleProfile* profile = nullptr;
  std::vector<size_t> ranked;  // op indices, most time saved per byte first
  std::vector<bool> swap;      // per op: offloaded rather than recomputed when not kept
  std::vector<Point> hull;     // lower convex hull, fewest bytes first
};

double bandwidth_for(const MemoryProfile& profile, const SolveOptions& options) {
  const double given = options.copy_bandwidth() > 0 ? options.copy_bandwidth() : profile.copy_bandwidth;
  switch (options.offload()) {
    case OffloadMode::Never: return 0;
    case OffloadMode::Auto: return profile.device.starts_with("cpu") ? 0 : given;
    case OffloadMode::Always: return given > 0 ? given : kDefaultForcedBandwidth;
  }
  return 0;
}

std::vector<Point> candidate_points(const ModuleProfile& m, double bandwidth, ModuleOptions& mo) {
  std::vector<Point> points;
  points.push_back({m.saved_bytes, 0.0, ModuleChoice::None, 0});
  points.push_back({m.input_bytes, m.forward_seconds, ModuleChoice::Full, 0});
  // Everything the forward saves crosses the bus twice (out and back).
  if (bandwidth > 0) points.push_back({0, 2.0 * static_cast<double>(m.saved_bytes) / bandwidth, ModuleChoice::Offload, 0});

  // Selective: not keeping an op costs its recomputation, or its two copies when cheaper.
  mo.swap.assign(m.ops.size(), false);
  std::vector<double> gain(m.ops.size(), 0.0);
  double base = std::max(0.0, m.selective_forward_seconds - m.forward_seconds) + m.replay_seconds;
  for (size_t k = 0; k < m.ops.size(); ++k) {
    const OpProfile& o = m.ops[k];
    double cost = std::max(0.0, o.seconds);
    const bool keepable = !o.mutated && !o.inplace && !o.view;
    if (keepable && bandwidth > 0) {
      const double copies = 2.0 * static_cast<double>(o.output_bytes) / bandwidth;
      if (copies < cost) cost = copies, mo.swap[k] = true;
    }
    base += cost;
    if (keepable && cost > 0) mo.ranked.push_back(k), gain[k] = cost;
  }
  std::stable_sort(mo.ranked.begin(), mo.ranked.end(), [&](size_t a, size_t b) {
    // gain[a] / bytes[a] > gain[b] / bytes[b], without dividing by zero
    return gain[a] * static_cast<double>(m.ops[b].output_bytes) > gain[b] * static_cast<double>(m.ops[a].output_bytes);
  });
  int64_t bytes = m.input_bytes;
  double seconds = base;
  points.push_back({bytes, seconds, ModuleChoice::Selective, 0});
  for (size_t j = 0; j < mo.ranked.size(); ++j) {
    bytes += m.ops[mo.ranked[j]].output_bytes;
    seconds -= gain[mo.ranked[j]];
    points.push_back({bytes, std::max(0.0, seconds), ModuleChoice::Selective, j + 1});
  }
  return points;
}

// Pareto front (more bytes must buy less time), then its lower convex hull: along it, the time
// saved per byte falls, so taking a module's upgrades in order is also taking the best first.
std::vector<Point> lower_hull(std::vector<Point> points) {
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return std::tie(a.bytes, a.seconds) < std::tie(b.bytes, b.seconds);
  });
  std::vector<Point> front;
  for (const Point& p : points) {
    if (front.empty() || p.seconds < front.back().seconds) front.push_back(p);
  }
  std::vector<Point> hull;
  for (const Point& p : front) {
    while (hull.size() >= 2) {
      const Point& o = hull[hull.size() - 2];
      const Point& a = hull.back();
      const double cross = static_cast<double>(a.bytes - o.bytes) * (p.seconds - o.seconds) -
                           (a.seconds - o.seconds) * static_cast<double>(p.bytes - o.bytes);
      if (cross > 0) break;
      hull.pop_back();
    }
    hull.push_back(p);
  }
  return hull;
}

std::vector<ModuleOptions> module_options(const MemoryProfile& profile, const SolveOptions& options) {
  if (profile.modules.empty()) throw std::invalid_argument("solve_plan: the profile has no module");
  const double bandwidth = bandwidth_for(profile, options);
  std::vector<ModuleOptions> out(profile.modules.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].profile = &profile.modules[i];
    out[i].hull = lower_hull(candidate_points(profile.modules[i], bandwidth, out[i]));
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
  std::vector<bool> kept(m.ops.size(), false);
  for (size_t j = 0; j < p.kept; ++j) kept[mo.ranked[j]] = true;
  for (size_t k = 0; k < m.ops.size(); ++k) {
    if (kept[k]) plan.save.push_back({m.ops[k].op, m.ops[k].call_index});
    else if (mo.swap[k]) plan.swap.push_back({m.ops[k].op, m.ops[k].call_index});
  }
  // Nothing kept, nothing swapped: that is full checkpointing without the interception.
  if (plan.save.empty() && plan.swap.empty()) plan.choice = ModuleChoice::Full;
  return plan;
}

int64_t min_bytes(const MemoryProfile& profile, const std::vector<ModuleOptions>& modules) {
  int64_t bytes = profile.other_bytes;
  for (const auto& mo : modules) bytes += mo.hull.front().bytes;
  return bytes;
}

std::string mib(int64_t bytes) {
  return std::to_string(static_cast<double>(bytes) / (1024.0 * 1024.0)).substr(0, 8) + " MiB (" +
         std::to_string(bytes) + " bytes)";
}

}  // namespace

int64_t min_plan_bytes(const MemoryProfile& profile, const SolveOptions& options) {
  return min_bytes(profile, module_options(profile, options));
}

Plan solve_plan(const MemoryProfile& profile, const Budget& budget, const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto modules = module_options(profile, options);
  const int64_t limit = budget.resolve(profile);
  int64_t bytes = min_bytes(profile, modules);
  if (bytes > limit) {
    throw std::invalid_argument("solve_plan: a budget of " + mib(limit) + " is below the least any plan holds, " +
                                mib(bytes) + " (" +
                                (bandwidth_for(profile, options) > 0 ? "offload or full checkpointing"
                                                                     : "full checkpointing") +
                                " of every module)");
  }
  // Merge the modules' upgrade chains by time saved per byte; ties go to the earlier module.
  // Each chain is consumed in its own order, so a module's upgrades are never taken out of turn.
  std::vector<size_t> at(modules.size(), 0);
  auto efficiency = [&](size_t i) {
    const Point& a = modules[i].hull[at[i]];
    const Point& b = modules[i].hull[at[i] + 1];
    return (a.seconds - b.seconds) / static_cast<double>(b.bytes - a.bytes);
  };
  auto later = [&](size_t x, size_t y) {
    const double ex = efficiency(x), ey = efficiency(y);
    return ex != ey ? ex < ey : x > y;
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> heads(later);
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].hull.size() > 1) heads.push(i);
  }
  while (!heads.empty()) {
    const size_t i = heads.top();
    const int64_t more = modules[i].hull[at[i] + 1].bytes - modules[i].hull[at[i]].bytes;
    if (bytes + more > limit) break;  // the longest prefix that fits: monotone in the budget
    heads.pop();
    bytes += more;
    if (++at[i] + 1 < modules[i].hull.size()) heads.push(i);
  }

  Plan plan;
  plan.budget_bytes = limit;
  plan.bytes = bytes;
  plan.none_bytes = profile.bytes_held;
  plan.none_step_seconds = profile.step_seconds;
  plan.step_seconds = profile.step_seconds;
  for (size_t i = 0; i < modules.size(); ++i) {
    plan.modules.push_back(module_plan(modules[i], modules[i].hull[at[i]]));
    plan.step_seconds += plan.modules.back().seconds;
  }
  plan.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

Plan plan_memory(torch::nn::Module& model, const std::function<void()>& step, const Budget& budget,
                 const PlannerOptions& options) {
  return solve_plan(profile_memory(model, step, options.profile()), budget, options.solve());
}

}  // namespace recompose
