#include "copy_window_model.h"
#include "replay_cost.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
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

SimulatedStep CopyWindowModel::simulate(const std::vector<ModuleLoad>& loads,
                                        int64_t base_bytes) const {
  const auto& ms = compute_.modules;
  const size_t n = ms.size();
  if (loads.size() != n) {
    throw std::invalid_argument(
        "recompose: CopyWindowModel::simulate: " + std::to_string(loads.size()) + " loads for " +
        std::to_string(n) + " modules");
  }
  SimulatedStep s;
  s.forward_wait_seconds.assign(n, 0.0);
  s.backward_wait_seconds.assign(n, 0.0);
  auto note = [&](int64_t bytes, bool backward, int module) {
    if (bytes > s.peak_bytes)
      s.peak_bytes = bytes, s.peak_in_backward = backward, s.peak_module = module;
  };
  auto copy_out = [&](size_t i) {
    return loads[i].offload_bytes > 0
               ? link_.d2h_seconds(loads[i].offload_bytes, loads[i].offload_copies)
               : 0.0;
  };
  auto copy_back = [&](size_t i) {
    return loads[i].offload_bytes > 0
               ? link_.h2d_seconds(loads[i].offload_bytes, loads[i].offload_copies)
               : 0.0;
  };

  // Copies on the copy stream, oldest first; they land in order.
  struct Flight {
    int64_t bytes;
    double lands;
    size_t module;
  };
  std::deque<Flight> flying;
  int64_t flying_bytes = 0;
  double link_free = 0;  // when the copy stream has run what is queued on it
  auto land = [&] {
    flying_bytes -= flying.front().bytes;
    flying.pop_front();
  };

  // Forward. `held`: base and what earlier modules keep.
  double t = 0;
  int64_t held = base_bytes;
  note(held, false, -1);
  for (size_t i = 0; i < n; ++i) {
    while (!flying.empty() && flying.front().lands <= t) land();
    // The throttle: an offloading module first waits (host and compute) until at most G - 1
    // earlier modules' copies are in flight.
    if (loads[i].offload_bytes > 0 && max_groups_in_flight_ > 0) {
      while (static_cast<int64_t>(flying.size()) >= max_groups_in_flight_) {
        s.forward_wait_seconds[flying.front().module] += flying.front().lands - t;
        t = flying.front().lands;
        land();
      }
    }
    const double start = t, end = t + ms[i].forward_seconds;
    const int64_t mine = loads[i].held_bytes + loads[i].offload_bytes;
    // Just before each copy lands: the module has allocated its share of the time so far.
    while (!flying.empty() && flying.front().lands <= end) {
      const double share =
          ms[i].forward_seconds > 0
              ? std::clamp((flying.front().lands - start) / ms[i].forward_seconds, 0.0, 1.0)
              : 0.0;
      note(
          held + flying_bytes + static_cast<int64_t>(std::floor(share * static_cast<double>(mine))),
          false, static_cast<int>(i));
      land();
    }
    note(held + flying_bytes + mine, false, static_cast<int>(i));
    t = end;
    held += loads[i].held_bytes;
    if (loads[i].offload_bytes > 0) {
      link_free = std::max(t, link_free) + copy_out(i);
      flying.push_back({loads[i].offload_bytes, link_free, i});
      flying_bytes += loads[i].offload_bytes;
    }
  }
  t += compute_.forward_tail_seconds;

  // Backward. A module's reload starts when the nearest later offloading module is first used
  // (prefetch), else when its own backward needs it; it queues behind what the stream has.
  std::vector<double> reloaded(n, -1.0);  // when the reload lands; < 0: not launched
  auto reload = [&](size_t i) {
    if (reloaded[i] >= 0) return;
    held += loads[i].offload_bytes;
    link_free = std::max(t, link_free) + copy_back(i);
    reloaded[i] = link_free;
  };
  auto previous_offloading = [&](size_t i) -> std::optional<size_t> {
    for (size_t j = i; j-- > 0;) {
      if (loads[j].offload_bytes > 0) return j;
    }
    return std::nullopt;
  };
  while (!flying.empty() && flying.front().lands <= t) land();
  note(held + flying_bytes, true, -1);
  t += compute_.backward_head_seconds;
  for (size_t i = n; i-- > 0;) {
    while (!flying.empty() && flying.front().lands <= t) land();
    if (loads[i].offload_bytes > 0) {
      reload(i);  // on demand, unless prefetched
      if (reloaded[i] > t) {
        s.backward_wait_seconds[i] = reloaded[i] - t;
        t = reloaded[i];
      }
      if (auto p = previous_offloading(i)) reload(*p);
    }
    note(held + flying_bytes + loads[i].backward_bytes, true, static_cast<int>(i));
    t += ms[i].backward_seconds + loads[i].recompute_seconds;
    held -= loads[i].held_bytes + loads[i].offload_bytes;
  }

  s.seconds = t;
  s.compute_seconds = compute_.forward_tail_seconds + compute_.backward_head_seconds;
  for (size_t i = 0; i < n; ++i) {
    s.compute_seconds +=
        ms[i].forward_seconds + ms[i].backward_seconds + loads[i].recompute_seconds;
  }
  return s;
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

ModuleLoad load_of(const ModuleProfile& m, const ModulePlan* plan) {
  ModuleLoad l;
  const ModuleChoice choice = plan ? plan->choice : ModuleChoice::None;
  switch (choice) {
    case ModuleChoice::None:
      l.held_bytes = m.saved_bytes;
      break;
    case ModuleChoice::Full:
      l.held_bytes = m.input_bytes;
      l.backward_bytes = std::max<int64_t>(0, m.saved_bytes - m.input_bytes);
      l.recompute_seconds = m.forward_seconds;
      break;
    case ModuleChoice::FullSwapInputs:
      // Inputs a later module takes too stay on the device (ModuleProfile::shared_input_bytes).
      l.held_bytes = m.shared_input_bytes;
      l.offload_bytes = std::max<int64_t>(0, m.input_bytes - m.shared_input_bytes);
      l.offload_copies = 1;
      l.backward_bytes = m.saved_bytes;
      l.recompute_seconds = m.forward_seconds;
      break;
    case ModuleChoice::Offload:
      l.held_bytes = m.shared_input_bytes;
      l.offload_bytes = std::max<int64_t>(0, m.saved_bytes - m.shared_input_bytes);
      l.offload_copies = offload_copies(m);
      break;
    case ModuleChoice::Selective: {
      auto listed = [](const std::vector<PlannedOp>& ops, const OpProfile& o) {
        return std::any_of(ops.begin(), ops.end(), [&](const PlannedOp& p) {
          return p.op == o.op && p.call_index == o.call_index;
        });
      };
      l.held_bytes = m.input_bytes + m.draw_bytes;
      // The recomputation runs what the replay needs of the ops neither kept nor offloaded.
      std::vector<bool> answered(m.ops.size(), false);
      for (size_t k = 0; k < m.ops.size(); ++k) {
        const OpProfile& o = m.ops[k];
        if (listed(plan->save, o)) {
          l.held_bytes += o.output_bytes;
          answered[k] = true;
        } else if (listed(plan->swap, o)) {
          l.offload_bytes += o.output_bytes;
          l.offload_copies += 1;
          answered[k] = true;
        }
      }
      l.recompute_seconds = std::max(0.0, m.selective_forward_seconds - m.forward_seconds) +
                            m.replay_seconds + ReplayCost(m).seconds(answered);
      l.backward_bytes = std::max<int64_t>(0, m.saved_bytes - l.held_bytes - l.offload_bytes);
      break;
    }
  }
  return l;
}

}  // namespace

std::vector<ModuleLoad> module_loads(const MemoryProfile& profile, const Plan& plan) {
  std::map<std::string, const ModulePlan*> by_name;
  for (const auto& m : plan.modules) by_name[m.name] = &m;
  std::vector<ModuleLoad> out;
  for (const auto& m : profile.modules) {
    auto it = by_name.find(m.name);
    out.push_back(load_of(m, it == by_name.end() ? nullptr : it->second));
  }
  return out;
}

SimulatedStep simulate_plan(const MemoryProfile& profile, const Plan& plan, const LinkModel& link,
                            int64_t max_groups_in_flight) {
  return CopyWindowModel(step_compute_of(profile), link, max_groups_in_flight)
      .simulate(module_loads(profile, plan), profile.other_bytes);
}

}  // namespace recompose::detail
