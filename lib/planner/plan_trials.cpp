// choose_plan(): the candidates the estimates rank first, tried on the model for a few real steps
// each, interleaved, and the fastest that fits as measured (recompose/planner.h).
//
// Note [ Choosing by measurement ]
// The solver's estimates add up the parts of one profiled step. A real step is not that sum: on
// the H100 and H200 the profiled step ran 5-8% faster than a plain one, swaps waited on the swap
// manager's throttle, the caching allocator retried near a cap; on CPU the estimates ran 10-15%
// high. So estimates rank close candidates wrongly, and the planner gave slower steps than a
// fixed policy a user would have picked. The planner measures instead: the solver's fastest plan
// of each family and every fixed preset that fits are candidates (candidate_plans); those
// estimated within TrialOptions::max_estimate_ratio of the fastest estimate, at most
// max_candidates, run, while the planning budget allows (TrialOptions::max_planning_steps plain
// steps for profiling, solving and trials together: the profile's own time counts):
//  1. each candidate's first step, in the estimates' order: the bytes held for backward (a
//     SavedTensorMeter) and, on a device, the peak of reserved memory from an emptied cache, in
//     an untimed step followed by a timed one (emptying the cache slows the step); on CPU the
//     metered step is timed. A step whose estimate (scaled by measured over estimated so far)
//     would overrun the budget is not started: its candidate is not tried;
//  2. timed rounds without a meter, each candidate once per round, the order rotated, while a
//     whole round fits.
// Where no checkpointing fits, it is the fastest estimate and nothing can be faster: on CPU it is
// chosen untried (on a device its reserved peak is measured like every candidate's).
// A candidate measured over the budget (bytes; a peak budget on a device: its reserved peak) is
// not chosen; of the others, the least median time wins, ties to the better estimate. The model
// is put back after every step (ModelStateGuard), as profile_memory does, so training after the
// planner is bitwise training without it.
#include "engine/format_bytes.h"
#include "engine/model_state_guard.h"
#include "memory/memory_in_use.h"
#include "model_device.h"

#include <recompose/device_memory.h>
#include <recompose/planner.h>
#include <recompose/saved_tensor_meter.h>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace recompose {
namespace {

using Clock = std::chrono::steady_clock;

// What a trial step may take beyond its estimate before it overruns the planning budget: the CPU
// sweeps of 2026-11-29 ran their last steps up to 0.15 plain steps past 6 without it.
constexpr double kStepMargin = 1.1;

double elapsed_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void synchronize_device(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void check(const TrialOptions& o) {
  if (!(o.max_planning_steps() > 0))
    throw std::invalid_argument("recompose: choose_plan: max_planning_steps must be positive");
  if (o.max_candidates() < 1)
    throw std::invalid_argument("recompose: choose_plan: max_candidates must be at least 1");
  if (!(o.max_estimate_ratio() >= 1))
    throw std::invalid_argument("recompose: choose_plan: max_estimate_ratio must be at least 1");
}

// The budget as the C++ that makes it, for the reproducing lines.
std::string budget_expression(const MemoryProfile& profile, const Budget& budget) {
  const int64_t limit = budget.resolve(profile);
  return budget.is_peak() ? "recompose::Budget::peak_bytes(" +
                                std::to_string(limit + profile.resident_bytes) + ")"
                          : "recompose::Budget::bytes(" + std::to_string(limit) + ")";
}

std::string reproduce_line(const std::string& name, size_t index, const std::string& budget) {
  const std::string each = "for each module of the plan: ";
  if (name == "none") return "nothing to apply: train the model as it is";
  if (name == "full") return each + "recompose::apply_checkpoint(module)";
  if (name == "transformer_policy")
    return each +
           "recompose::apply_checkpoint(module, "
           "recompose::CheckpointOptions().policy(recompose::transformer_policy()))";
  if (name == "every second mm")
    return each +
           "recompose::apply_checkpoint(module, recompose::CheckpointOptions().policy("
           "recompose::transformer_policy(recompose::TransformerPolicyOptions()."
           "recompute_every_second_mm(true))))";
  if (name == "offload") return each + "recompose::apply_offload(module)";
  return "recompose::apply_plan(model, recompose::candidate_plans(profile, " + budget + ")[" +
         std::to_string(index) + "].plan)";
}

// What the planning may still spend: TrialOptions::max_planning_steps plain steps (the profile's
// measured step), less the profile's own time and what choosing has taken since `start`.
class TrialBudget {
 public:
  TrialBudget(const MemoryProfile& profile, const TrialOptions& options)
      : plain_step_(profile.step_seconds),
        limit_(options.max_planning_steps() * profile.step_seconds - profile.profile_seconds),
        start_(Clock::now()) {}
  // False where the profile has no measured step (made by hand): nothing to count in.
  bool counted() const { return plain_step_ > 0; }
  bool allows(double seconds) const {
    return !counted() || elapsed_since(start_) + seconds <= limit_;
  }

 private:
  double plain_step_;
  double limit_;
  Clock::time_point start_;
};

struct Candidate {
  PlanCandidate c;
  size_t index = 0;  // in candidate_plans
  PlanTrial row;
  std::vector<double> timed;
  std::string out_of_memory;  // its trial ran out of device memory (a cap): what was said
};

// One step of `model` under `plan`, applied for it and removed after; the model put back.
class TrialRunner {
 public:
  TrialRunner(torch::nn::Module& model, const std::function<void()>& step)
      : model_(model), step_(step), device_(detail::device_of(model)), state_(model, device_) {}

  // On a device the measuring step empties the cache first (its reserved peak is the plan's own,
  // not what earlier steps left reserved), which slows it: it is not timed, a timed step follows.
  // On CPU the metered step is the timed one (the meter adds a pack hook per saved tensor, the
  // same work for every candidate that saves the tensor).
  bool measures_apart() const { return device_.is_cuda(); }

  // The measuring step: bytes held for backward, and the device's reserved peak from an empty
  // cache (-1 on CPU). Returns its time.
  double measure(const Plan& plan, PlanTrial& row) {
    synchronize_device(device_);
    detail::release_cached_memory(device_);
    reset_peak_device_memory(device_);
    const auto t0 = Clock::now();
    {
      SavedTensorMeter meter;
      run(plan);
      row.measured_bytes = meter.peak_bytes_held();
    }
    synchronize_device(device_);
    const double seconds = elapsed_since(t0);
    row.measured_peak_bytes = peak_reserved_device_memory(device_);
    return seconds;
  }

  double timed(const Plan& plan) {
    synchronize_device(device_);
    const auto t0 = Clock::now();
    run(plan);
    synchronize_device(device_);
    return elapsed_since(t0);
  }

 private:
  void run(const Plan& plan) {
    apply_plan(model_, plan);
    try {
      step_();
    } catch (...) {
      remove_plan(model_, plan);
      state_.restore();  // the guard does it too if the error goes through; a trial may go on
      throw;
    }
    remove_plan(model_, plan);
    state_.restore();
  }

  torch::nn::Module& model_;
  const std::function<void()>& step_;
  torch::Device device_;
  detail::ModelStateGuard state_;
};

// Which candidates run: the fastest estimates, within the ratio, at most max_candidates.
std::vector<Candidate> pick(std::vector<PlanCandidate> all, const TrialOptions& o,
                            const std::string& budget) {
  std::vector<Candidate> out;
  const double fastest = all.empty() ? 0 : all.front().plan.step_seconds;
  for (size_t i = 0; i < all.size(); ++i) {
    Candidate c{std::move(all[i]), i, {}, {}, {}};
    c.row.name = c.c.name;
    c.row.bytes = c.c.plan.bytes;
    c.row.step_seconds = c.c.plan.step_seconds;
    c.row.peak_bytes = c.c.plan.peak_bytes;
    c.row.reproduce = reproduce_line(c.c.name, i, budget);
    out.push_back(std::move(c));
  }
  int64_t tried = 0;
  for (auto& c : out) {
    char why[128];
    if (!o.enabled()) {
      c.row.verdict = "not tried (trials off)";
    } else if (c.row.step_seconds > o.max_estimate_ratio() * fastest) {
      std::snprintf(why, sizeof why, "not tried: estimated %.2fx the fastest estimate",
                    fastest > 0 ? c.row.step_seconds / fastest : 0.0);
      c.row.verdict = why;
    } else if (tried >= o.max_candidates()) {
      c.row.verdict = "not tried: max_candidates reached";
    } else {
      ++tried;
      c.row.verdict = "tried";  // settled in decide()
    }
  }
  return out;
}

bool tried(const Candidate& c) { return c.row.verdict == "tried"; }

// Every module left as it is: nothing is faster, and its bytes are the profile's own.
bool is_no_checkpointing(const Plan& plan) {
  return std::all_of(plan.modules.begin(), plan.modules.end(),
                     [](const ModulePlan& m) { return m.choice == ModuleChoice::None; });
}

// Each candidate's first step, in the estimates' order, while the planning budget allows it (on a
// device an untimed measuring step and a timed one; on CPU one metered step, timed); then timed
// rounds, interleaved and rotated, while a whole round fits. No step starts that its estimate,
// scaled by what the steps so far measured against their estimates, says would overrun.
void run_trials(TrialRunner& runner, std::vector<Candidate>& cands, const TrialBudget& budget) {
  // A candidate that runs out of device memory (under a cap) is out; any other error is the
  // user's step's, and goes through.
  auto attempt = [](Candidate* c, auto&& f) {
    if (!c->out_of_memory.empty()) return;
    try {
      f();
    } catch (const c10::OutOfMemoryError& e) {
      c->out_of_memory = e.what();
    }
  };
  double estimated = 0, measured = 0;  // over the candidates timed so far
  auto scale = [&] { return estimated > 0 ? measured / estimated : 1.0; };
  std::vector<Candidate*> order;
  for (auto& c : cands) {
    if (!tried(c)) continue;
    // With a margin: a step runs slower than the ones before it about as often as faster.
    const double cost =
        kStepMargin * c.row.step_seconds * scale() * (runner.measures_apart() ? 2 : 1);
    if (!budget.allows(cost)) {
      c.row.verdict = "not tried: the planning budget was spent";
      continue;
    }
    order.push_back(&c);
    attempt(&c, [&] {
      const double t = runner.measure(c.c.plan, c.row);
      c.timed.push_back(runner.measures_apart() ? runner.timed(c.c.plan) : t);
      estimated += c.row.step_seconds;
      measured += c.timed.back();
    });
  }
  // No plain step to count in: one step each; one candidate: nothing to compare it with.
  if (!budget.counted() || order.size() < 2) return;
  for (size_t round = 1;; ++round) {
    double round_cost = 0;
    for (Candidate* c : order) round_cost += c->timed.empty() ? 0 : median_of(c->timed);
    if (!budget.allows(kStepMargin * round_cost)) break;
    for (size_t k = 0; k < order.size(); ++k) {
      Candidate* c = order[(k + round) % order.size()];  // rotated: drift spreads evenly
      attempt(c, [&] { c->timed.push_back(runner.timed(c->c.plan)); });
    }
  }
}

// The chosen candidate: fits as measured, least median time; the verdicts of the others.
size_t decide(std::vector<Candidate>& cands, const MemoryProfile& profile, const Budget& budget) {
  const int64_t limit = budget.resolve(profile);
  const int64_t peak_limit = limit + profile.resident_bytes;
  size_t best = cands.size();
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    if (!tried(c)) continue;
    c.row.timed_steps = static_cast<int64_t>(c.timed.size());
    c.row.measured_seconds = c.timed.empty() ? 0 : median_of(c.timed);
    const bool over_peak = budget.is_peak() && c.row.measured_peak_bytes >= 0 &&
                           c.row.measured_peak_bytes > peak_limit;
    if (!c.out_of_memory.empty()) {
      c.row.verdict = "out of device memory in its trial: " +
                      c.out_of_memory.substr(0, c.out_of_memory.find('\n'));
    } else if (c.row.measured_bytes > limit && !budget.is_peak()) {
      c.row.verdict = "over the budget as measured: " + detail::format_mib(c.row.measured_bytes) +
                      " held for " + detail::format_mib(limit);
    } else if (over_peak) {
      c.row.verdict = "over the budget as measured: a peak of " +
                      detail::format_mib(c.row.measured_peak_bytes) + " reserved for " +
                      detail::format_mib(peak_limit);
    } else if (best == cands.size() || c.row.measured_seconds < cands[best].row.measured_seconds) {
      best = i;
    }
  }
  // Nothing tried, or nothing fit as measured: the fastest estimate (candidate_plans' first).
  const bool measured = best < cands.size();
  const bool any_timed =
      std::any_of(cands.begin(), cands.end(), [](const Candidate& c) { return !c.timed.empty(); });
  if (!measured) best = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    if (i == best) {
      c.row.chosen = true;
      c.row.verdict = measured    ? "chosen"
                      : any_timed ? "chosen: the fastest estimate (no candidate tried fit as "
                                    "measured; its own trial: " +
                                        c.row.verdict + ")"
                                  : "chosen: the fastest estimate (" + c.row.verdict + ")";
    } else if (tried(c)) {
      char why[96];
      std::snprintf(why, sizeof why, "slower: %.3fx the chosen one's measured step",
                    cands[best].row.measured_seconds > 0
                        ? c.row.measured_seconds / cands[best].row.measured_seconds
                        : 0.0);
      c.row.verdict = why;
    }
  }
  return best;
}

}  // namespace

Plan choose_plan(torch::nn::Module& model, const std::function<void()>& step,
                 const MemoryProfile& profile, const Budget& budget,
                 const PlannerOptions& options) {
  if (!step) throw std::invalid_argument("recompose: choose_plan: the step function is empty");
  check(options.trials());
  const TrialBudget trial_budget(profile, options.trials());
  const auto start = Clock::now();
  const std::string budget_text = budget_expression(profile, budget);
  std::vector<Candidate> cands =
      pick(candidate_plans(profile, budget, options.solve()), options.trials(), budget_text);
  if (std::any_of(cands.begin(), cands.end(), tried)) {
    if (is_no_checkpointing(cands.front().c.plan) && !detail::device_of(model).is_cuda()) {
      // It fits, and nothing is faster: no trial can choose another (on a device its reserved
      // peak is measured, as every candidate's).
      for (auto& c : cands) {
        if (tried(c)) c.row.verdict = "not tried: no checkpointing fits the budget";
      }
      cands.front().row.verdict = "no checkpointing fits the budget, and nothing is faster";
    } else {
      TrialRunner runner(model, step);
      run_trials(runner, cands, trial_budget);
    }
  }
  const size_t chosen = decide(cands, profile, budget);
  Plan plan = cands[chosen].c.plan;
  for (auto& c : cands) plan.trials.push_back(std::move(c.row));
  plan.planning_seconds = profile.profile_seconds + elapsed_since(start);
  plan.planning_steps =
      profile.step_seconds > 0 ? plan.planning_seconds / profile.step_seconds : 0.0;
  return plan;
}

}  // namespace recompose
