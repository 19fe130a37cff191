#include "preset_plans.h"

#include "frontier.h"
#include "keep_rules.h"
#include "module_pricing.h"

#include <utility>
#include <vector>

namespace recompose::detail {
namespace {

ModulePlan preset_entry(const ModulePricing& pricing, Preset preset) {
  const ModuleProfile& m = pricing.module();
  ModulePlan mp;
  mp.name = m.name;
  mp.type = m.type;
  if (preset != Preset::TransformerPolicy && preset != Preset::EverySecondMm) {
    mp.choice = preset == Preset::None   ? ModuleChoice::None
                : preset == Preset::Full ? ModuleChoice::Full
                                         : ModuleChoice::Offload;
    const Price p = pricing.price(mp.choice);
    mp.bytes = p.bytes, mp.seconds = p.seconds;
    return mp;
  }
  const std::vector<bool> keep = transformer_keep_set(m, preset == Preset::EverySecondMm);
  const Price p = pricing.selective(keep);
  mp.choice = ModuleChoice::Selective;
  mp.bytes = p.bytes, mp.seconds = p.seconds;
  for (size_t k = 0; k < m.ops.size(); ++k) {
    if (keep[k]) mp.save.push_back({m.ops[k].op, m.ops[k].call_index});
  }
  return mp;
}

}  // namespace

Plan preset_plan(const MemoryProfile& profile, Preset preset, int64_t limit, const Judge& judge,
                 const CopyWindowModel* windows) {
  Plan plan = plan_for(profile, limit);
  // As the offload family's base: an offloaded module holds what it saves until its call ends.
  plan.bytes = profile.other_bytes + (preset == Preset::Offload ? largest_saved(profile) : 0);
  plan.step_seconds = profile.step_seconds;
  for (size_t i = 0; i < profile.modules.size(); ++i) {
    ModulePlan mp = preset_entry(ModulePricing(profile.modules[i], i, windows), preset);
    plan.bytes += mp.bytes;
    plan.step_seconds += mp.seconds;
    plan.modules.push_back(std::move(mp));
  }
  judge.finish(plan);
  return plan;
}

}  // namespace recompose::detail
