// estimate_plan(): a given plan priced on a profile as the solver prices its own plans
// (module_pricing.h, then the Judge's simulated peak and step).
#include "frontier.h"
#include "module_pricing.h"
#include "plan_judge.h"
#include "twin_modules.h"

#include <recompose/planner.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace recompose {
namespace {

// Per op of `m`, whether `ops` lists it; every listed op must be one of `m`'s.
std::vector<bool> marked(const ModuleProfile& m, const std::vector<PlannedOp>& ops) {
  std::vector<bool> out(m.ops.size(), false);
  for (const PlannedOp& p : ops) {
    auto it = std::find_if(m.ops.begin(), m.ops.end(), [&](const OpProfile& o) {
      return o.op == p.op && o.call_index == p.call_index;
    });
    if (it == m.ops.end()) {
      throw std::invalid_argument("recompose: estimate_plan: module '" + m.name + "' ran no " +
                                  p.op + " call " + std::to_string(p.call_index) +
                                  " in the profile");
    }
    out[static_cast<size_t>(it - m.ops.begin())] = true;
  }
  return out;
}

// One module's entry, priced: its choice, kept and swapped ops as the plan says.
ModulePlan priced(const detail::ModulePricing& pricing, const ModulePlan& wanted) {
  const ModuleProfile& m = pricing.module();
  ModulePlan mp = wanted;
  if (mp.choice != ModuleChoice::Selective) {
    if (!pricing.offers(mp.choice)) {
      throw std::invalid_argument("recompose: estimate_plan: module '" + m.name +
                                  "': " + std::string(module_choice_name(mp.choice)) +
                                  " copies to host memory, which these SolveOptions do not allow "
                                  "for this profile (no link: OffloadMode, copy_bandwidth)");
    }
    const detail::Price p = pricing.price(mp.choice);
    mp.bytes = p.bytes, mp.seconds = p.seconds;
    return mp;
  }
  const std::vector<bool> keep = marked(m, mp.save);
  const std::vector<bool> swap = marked(m, mp.swap);
  detail::Price p;
  if (std::find(swap.begin(), swap.end(), true) == swap.end()) {
    p = pricing.selective(keep);
  } else {
    // The plan's swaps, each at its copies' share where the solver would swap it too (else at its
    // recomputation: an approximation for a hand-made plan).
    detail::DropCosts drops = pricing.drop_costs();
    drops.swap = swap;
    p = pricing.selective(keep, &drops);
  }
  mp.bytes = p.bytes, mp.seconds = p.seconds;
  return mp;
}

}  // namespace

Plan estimate_plan(const MemoryProfile& measured, const Plan& plan, const SolveOptions& options) {
  const MemoryProfile profile = detail::with_twins_at_their_fastest(measured);
  const detail::Judge judge = detail::judge_of(profile, options);
  const std::optional<detail::CopyWindowModel> windows = detail::windows_for(profile, options);
  std::map<std::string, const ModulePlan*> by_name;
  for (const ModulePlan& m : plan.modules) {
    const bool known = std::any_of(profile.modules.begin(), profile.modules.end(),
                                   [&](const ModuleProfile& p) { return p.name == m.name; });
    if (!known) {
      throw std::invalid_argument("recompose: estimate_plan: the plan names module '" + m.name +
                                  "', which the profile has not");
    }
    by_name[m.name] = &m;
  }
  Plan out = detail::plan_for(profile, plan.budget_bytes);
  const bool offloads = std::any_of(plan.modules.begin(), plan.modules.end(), [](const auto& m) {
    return m.choice == ModuleChoice::Offload;
  });
  // As the offload family's base: an offloaded module holds what it saves until its call ends.
  out.bytes = profile.other_bytes + (offloads ? detail::largest_saved(profile) : 0);
  out.step_seconds = profile.step_seconds;
  for (size_t i = 0; i < profile.modules.size(); ++i) {
    const ModuleProfile& m = profile.modules[i];
    const detail::ModulePricing pricing(m, i, windows ? &*windows : nullptr);
    ModulePlan none;
    none.name = m.name, none.type = m.type;
    auto it = by_name.find(m.name);
    if (it != by_name.end() && it->second->type != m.type) {
      throw std::invalid_argument("recompose: estimate_plan: module '" + m.name + "' is a " +
                                  m.type + " in the profile, a " + it->second->type +
                                  " in the plan");
    }
    ModulePlan mp = priced(pricing, it == by_name.end() ? none : *it->second);
    out.bytes += mp.bytes;
    out.step_seconds += mp.seconds;
    out.modules.push_back(std::move(mp));
  }
  judge.finish(out);
  return out;
}

}  // namespace recompose
