// solve_plan() and candidate_plans(): a budget's candidates (per family the frontier's fastest
// plan that fits, and the fixed presets), the errors when none fits, and the choice among them.
// The pieces: module_pricing.h (what a module's choice costs), module_candidates.h (each
// module's configurations), frontier.h (the Pareto frontier of whole plans), plan_judge.h (the
// simulated peak and step), preset_plans.h (the fixed presets).
#include "copy_window_model.h"
#include "engine/format_bytes.h"
#include "frontier.h"
#include "plan_judge.h"
#include "preset_plans.h"
#include "twin_modules.h"

#include <recompose/planner.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace recompose {
namespace {

using detail::Family;
using detail::Final;
using detail::Judge;
using detail::Node;

constexpr const char* kFamilyNames[] = {"solver (no copies)", "solver (swaps)", "solver (offload)"};

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

// The fastest plan of family `f`'s frontier within `limit` bytes that `fits`.
template <class Fits>
std::optional<Plan> fastest_fitting(const MemoryProfile& profile, const std::vector<Family>& fams,
                                    size_t f, int64_t limit, const Judge& judge, Fits& fits) {
  const auto& last = fams[f].fronts.back();
  auto it = std::upper_bound(last.begin(), last.end(), limit,
                             [](int64_t b, const Node& n) { return b < n.bytes; });
  // Down the frontier the added-up estimate grows, and a plan's estimate is at least it: once it
  // reaches the best estimate found, no plan further down is faster. So this is the fastest
  // fitting plan of the family, and a larger budget (more plans fit) never gives a slower one.
  std::optional<Plan> best;
  for (auto i = static_cast<size_t>(it - last.begin()); i-- > 0;) {
    if (best && profile.step_seconds + last[i].seconds >= best->step_seconds) break;
    Plan p = detail::plan_at(profile, fams, {last[i].bytes, last[i].seconds, f, i}, limit, judge);
    if (fits(p) && (!best || p.step_seconds < best->step_seconds)) best = std::move(p);
  }
  return best;
}

// The candidates a budget chooses from: per family, the fastest frontier plan within `limit`
// bytes whose peak fits (`peak`; none: no peak budget); and transformer_policy everywhere. `least`
// gets the plan needing the least of a peak budget seen.
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
    if (auto best = fastest_fitting(profile, fams, f, limit, judge, seen))
      out.push_back({kFamilyNames[f], std::move(*best)});
    if (f == 0) {
      // The fixed policy a user would try first, a candidate whatever the frontier's thinning and
      // the peak walk left.
      Plan t =
          detail::preset_plan(profile, detail::Preset::TransformerPolicy, limit, judge, nullptr);
      if (t.bytes <= limit && seen(t)) out.push_back({"transformer_policy", std::move(t)});
    }
  }
  return out;
}

// One solve for one budget: the profile (twins at their fastest), the families' frontiers and the
// candidates that fit; the errors solve_plan and candidate_plans share. Not copyable: the judge
// refers to the profile.
struct Solve {
  Solve(const MemoryProfile& measured, const Budget& budget, const SolveOptions& options);
  Solve(const Solve&) = delete;
  Solve& operator=(const Solve&) = delete;

  // Within the budget: its bytes, and a peak budget's usable part.
  bool fits(const Plan& p) const {
    return p.bytes <= limit && (!peak || judge.needs(p) <= judge.usable(*peak));
  }
  const detail::CopyWindowModel* copy_windows() const { return windows ? &*windows : nullptr; }

  MemoryProfile profile;
  Judge judge;
  std::optional<detail::CopyWindowModel> windows;
  std::vector<Family> fams;
  int64_t limit = 0;
  std::optional<int64_t> peak;
  // Per family the fastest fitting frontier plan, and transformer_policy everywhere if it fits;
  // never empty.
  std::vector<PlanCandidate> fitting;

 private:
  void check_least_bytes(const Budget& budget) const;
  [[noreturn]] void no_peak_fits(const Plan& least) const;
};

Solve::Solve(const MemoryProfile& measured, const Budget& budget, const SolveOptions& options)
    : profile(detail::with_twins_at_their_fastest(measured)),
      judge(detail::judge_of(profile, options)),
      windows(detail::windows_for(profile, options)),
      fams(detail::families(profile, copy_windows())),
      limit(budget.resolve(profile)) {
  check_least_bytes(budget);
  if (budget.is_peak()) peak = limit + profile.resident_bytes;
  std::optional<Plan> least;
  fitting = candidates(profile, fams, limit, peak, judge, least);
  // Only a peak budget finds none: within the bytes, a plan exists.
  if (fitting.empty()) no_peak_fits(*least);
}

// Throws if the budget is below the least any plan holds.
void Solve::check_least_bytes(const Budget& budget) const {
  const int64_t least = detail::final_frontier(fams).front().bytes;
  if (budget.is_peak() && least > limit) {
    throw std::invalid_argument(
        "recompose: solve_plan: a peak of " + detail::format_mib(limit + profile.resident_bytes) +
        " leaves " + detail::format_mib(limit) + " for activations beside the profile's resident " +
        detail::format_mib(profile.resident_bytes) + resident_in_words(profile) +
        ", below the least any plan holds, " + detail::format_mib(least) +
        " (min_plan_peak_bytes gives the least feasible peak)");
  }
  if (least > limit) {
    throw std::invalid_argument(
        "recompose: solve_plan: a budget of " + detail::format_mib(limit, /*exact=*/true) +
        " is below the least any plan holds, " + detail::format_mib(least, /*exact=*/true) + " (" +
        (fams.size() > 1 ? "offload or full checkpointing" : "full checkpointing") +
        " of every module)");
  }
}

// A peak budget no plan's simulated peak fits; `least` needs the least of it.
void Solve::no_peak_fits(const Plan& least) const {
  const std::string headroom =
      judge.headroom > 0
          ? " less the caching allocator's headroom (SolveOptions::allocator_headroom, " +
                std::to_string(static_cast<int>(std::lround(judge.headroom * 100))) +
                "%: " + detail::format_mib(*peak - judge.usable(*peak)) + ")"
          : std::string();
  throw std::invalid_argument(
      "recompose: solve_plan: a peak of " + detail::format_mib(*peak) + headroom +
      " is below the least simulated peak of any plan, " + detail::format_mib(least.peak_bytes) +
      " (min_plan_peak_bytes gives the least budget), of which resident " +
      detail::format_mib(profile.resident_bytes) + resident_in_words(profile) +
      "; that plan's peak falls " + where_peak_falls(profile, least, judge));
}

// The fixed presets that fit, in candidate_plans' order (offload where copies are priced).
std::vector<PlanCandidate> fitting_presets(const Solve& s) {
  using detail::Preset;
  const std::pair<const char*, Preset> kPresets[] = {
      {"none", Preset::None},
      {"full", Preset::Full},
      {"transformer_policy", Preset::TransformerPolicy},
      {"every second mm", Preset::EverySecondMm},
      {"offload", Preset::Offload}};
  std::vector<PlanCandidate> out;
  for (const auto& [name, preset] : kPresets) {
    if (preset == Preset::Offload && !s.windows) continue;
    Plan p = detail::preset_plan(s.profile, preset, s.limit, s.judge, s.copy_windows());
    if (s.fits(p)) out.push_back({name, std::move(p)});
  }
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
  const auto windows = detail::windows_for(profile, options);
  const auto fams = detail::families(profile, windows ? &*windows : nullptr);
  return detail::final_frontier(fams).front().bytes;
}

int64_t min_plan_peak_bytes(const MemoryProfile& measured, const SolveOptions& options) {
  const MemoryProfile profile = detail::with_twins_at_their_fastest(measured);
  const Judge judge = detail::judge_of(profile, options);
  const auto windows = detail::windows_for(profile, options);
  const auto fams = detail::families(profile, windows ? &*windows : nullptr);
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t f = 0; f < fams.size(); ++f) {
    const auto& last = fams[f].fronts.back();
    for (size_t i = 0; i < last.size(); ++i) {
      const Plan p = detail::plan_at(profile, fams, {last[i].bytes, last[i].seconds, f, i},
                                     last[i].bytes, judge);
      least = std::min(least, judge.needs(p));
    }
  }
  const Plan t = detail::preset_plan(profile, detail::Preset::TransformerPolicy, 0, judge, nullptr);
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
  for (auto& c : fitting_presets(s)) {
    const bool weighed = c.name == "transformer_policy";
    all.push_back({std::move(c), weighed});
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
