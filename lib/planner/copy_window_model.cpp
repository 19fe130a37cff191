#include "copy_window_model.h"

#include "module_pricing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace recompose::detail {

CopyWindowModel::CopyWindowModel(StepCompute compute, LinkModel link, int64_t max_groups_in_flight)
    : compute_(std::move(compute)), link_(link), max_groups_in_flight_(max_groups_in_flight) {
  if (!link_.valid()) {
    throw std::invalid_argument(
        "recompose: CopyWindowModel: the link needs positive, finite bandwidths both ways and a "
        "non-negative cost per copy");
  }
  bool ok = max_groups_in_flight_ >= 0 && compute_.forward_tail_seconds >= 0 &&
            compute_.backward_head_seconds >= 0;
  for (const auto& m : compute_.modules)
    ok = ok && m.forward_seconds >= 0 && m.backward_seconds >= 0;
  if (!ok)
    throw std::invalid_argument(
        "recompose: CopyWindowModel: compute times and max_groups_in_flight must not be negative");
}

double CopyWindowModel::forward_window(size_t i) const {
  const auto& ms = compute_.modules;
  return i + 1 < ms.size() ? ms[i + 1].forward_seconds : compute_.forward_tail_seconds;
}

double CopyWindowModel::backward_window(size_t i) const {
  const auto& ms = compute_.modules;
  return i + 1 < ms.size() ? ms[i + 1].backward_seconds : compute_.backward_head_seconds;
}

double CopyWindowModel::exposed_seconds(size_t i, int64_t bytes, int64_t copies) const {
  if (bytes <= 0 && copies <= 0) return 0;
  return std::max(0.0, link_.d2h_seconds(bytes, copies) - forward_window(i)) +
         std::max(0.0, link_.h2d_seconds(bytes, copies) - backward_window(i));
}

int64_t CopyWindowModel::free_bytes(size_t i, int64_t copies) const {
  const double fixed = static_cast<double>(copies) * link_.seconds_per_copy;
  const double out = (forward_window(i) - fixed) * link_.d2h_bytes_per_second;
  const double back = (backward_window(i) - fixed) * link_.h2d_bytes_per_second;
  const double most = std::min(out, back);
  if (!(most > 0)) return 0;
  return most >= 9e18 ? std::numeric_limits<int64_t>::max()
                      : static_cast<int64_t>(std::floor(most));
}

StepCompute step_compute_of(const MemoryProfile& profile) {
  StepCompute c;
  double forwards = 0;
  for (const auto& m : profile.modules) {
    c.modules.push_back({std::max(0.0, m.forward_seconds), 0.0});
    forwards += c.modules.back().forward_seconds;
  }
  const double rest = std::max(0.0, profile.step_seconds - forwards);
  double backwards = 0;
  if (profile.backward_measured()) {
    for (size_t i = 0; i < c.modules.size(); ++i) backwards += profile.modules[i].backward_seconds;
    // Spans and the step are timed separately: never more backward than the step leaves.
    const double scale = backwards > rest ? rest / backwards : 1.0;
    backwards = 0;
    for (size_t i = 0; i < c.modules.size(); ++i) {
      backwards += (c.modules[i].backward_seconds = scale * profile.modules[i].backward_seconds);
    }
  } else {
    const double scale = forwards > 0 ? std::min(2.0, rest / forwards) : 0.0;
    for (auto& m : c.modules) backwards += (m.backward_seconds = scale * m.forward_seconds);
  }
  const double left = std::max(0.0, rest - backwards);
  c.forward_tail_seconds = left / 3;
  c.backward_head_seconds = left - c.forward_tail_seconds;
  return c;
}

int64_t offload_copies(const ModuleProfile& m) {
  int64_t n = 0;
  for (const auto& o : m.ops) n += o.output_bytes > 0 ? 1 : 0;
  return std::max<int64_t>(1, n);
}

namespace {

// Per op of `m`, whether `ops` lists it (by overload and call index).
std::vector<bool> listed(const ModuleProfile& m, const std::vector<PlannedOp>& ops) {
  std::vector<bool> out(m.ops.size(), false);
  for (size_t k = 0; k < m.ops.size(); ++k) {
    const OpProfile& o = m.ops[k];
    out[k] = std::any_of(ops.begin(), ops.end(), [&](const PlannedOp& p) {
      return p.op == o.op && p.call_index == o.call_index;
    });
  }
  return out;
}

}  // namespace

std::vector<ModuleLoad> module_loads(const MemoryProfile& profile, const Plan& plan) {
  std::map<std::string, const ModulePlan*> by_name;
  for (const auto& m : plan.modules) by_name[m.name] = &m;
  std::vector<ModuleLoad> out;
  for (size_t i = 0; i < profile.modules.size(); ++i) {
    const ModuleProfile& m = profile.modules[i];
    auto it = by_name.find(m.name);
    // The time line places the copies: no windows needed to say what a choice moves.
    const ModulePricing pricing(m, i, nullptr);
    if (it == by_name.end()) {
      out.push_back(pricing.load(ModuleChoice::None));
      continue;
    }
    const ModulePlan& mp = *it->second;
    out.push_back(mp.choice == ModuleChoice::Selective
                      ? pricing.load(mp.choice, listed(m, mp.save), listed(m, mp.swap))
                      : pricing.load(mp.choice));
  }
  return out;
}

SimulatedStep simulate_plan(const MemoryProfile& profile, const Plan& plan, const LinkModel& link,
                            int64_t max_groups_in_flight) {
  return CopyWindowModel(step_compute_of(profile), link, max_groups_in_flight)
      .simulate(module_loads(profile, plan), profile.other_bytes);
}

}  // namespace recompose::detail
