#include "plan_judge.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace recompose::detail {
namespace {

constexpr double kDefaultForcedBandwidth = 1e10;

}  // namespace

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

std::optional<CopyWindowModel> windows_for(const MemoryProfile& profile,
                                           const SolveOptions& options) {
  const auto link = link_for(profile, options);
  if (!link) return std::nullopt;
  return CopyWindowModel(step_compute_of(profile), *link, options.max_groups_in_flight());
}

void Judge::finish(Plan& plan) const {
  const SimulatedStep s = simulate_plan(profile, plan, link, max_groups_in_flight);
  plan.peak_bytes = profile.resident_bytes + s.peak_bytes;
  plan.step_seconds = std::max(plan.step_seconds, s.seconds);
}

int64_t Judge::needs(const Plan& plan) const {
  int64_t pool = 0;
  if (headroom > 0) {
    for (const auto& l : module_loads(profile, plan)) pool = std::max(pool, l.offload_bytes);
  }
  return plan.peak_bytes + pool;
}

int64_t Judge::usable(int64_t peak) const {
  return peak - static_cast<int64_t>(std::ceil(headroom * static_cast<double>(peak)));
}

int64_t Judge::least_budget(int64_t need) const {
  if (headroom <= 0) return need;
  auto b = static_cast<int64_t>(std::ceil(static_cast<double>(need) / (1.0 - headroom)));
  while (usable(b) < need) ++b;
  while (b > need && usable(b - 1) >= need) --b;
  return b;
}

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

Plan plan_for(const MemoryProfile& profile, int64_t limit) {
  Plan plan;
  plan.budget_bytes = limit;
  plan.none_bytes = profile.bytes_held;
  plan.none_step_seconds = profile.step_seconds;
  plan.backward_measured = profile.backward_measured();
  return plan;
}

}  // namespace recompose::detail
