#include "sweep.h"

#include "compare.h"
#include "offload_link.h"
#include "planning.h"
#include "plot.h"
#include "progress.h"

#include <recompose/planner.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace gpt {
namespace {

struct Entry {
  std::string name;
  bool planned = false;
  std::shared_ptr<const recompose::Plan> plan;
  double fraction =
      0;  // planned: the budget as a fraction of none's bytes (--sweep-peak: of none's peak)
  int64_t peak_budget = 0;  // --sweep-peak: the budget of device memory
  std::unique_ptr<Trainer> trainer;
  std::vector<StepRecord> steps;

  double step_seconds() const { return median_step_seconds(steps); }
  int64_t held() const {
    int64_t m = 0;
    for (const auto& r : steps) m = std::max(m, r.bytes_held);
    return m;
  }
  int64_t swapped() const { return steps.empty() ? 0 : steps.back().bytes_swapped; }
  // Peak memory of a step above what it starts with (weights, optimizer state, batch): on a
  // device, what the activations, gradients and temporaries really take, the caching
  // allocator's figure.
  int64_t step_peak() const {
    int64_t m = 0;
    for (const auto& r : steps) m = std::max(m, r.peak_memory - r.resting_memory);
    return m;
  }
  // The peak of this run as if it were alone in the process (StepRecord::own_peak_memory): the
  // caching allocator's peak of its steps, less what the sweep's other runs hold meanwhile.
  int64_t own_peak() const {
    int64_t m = 0;
    for (const auto& r : steps) m = std::max(m, r.own_peak_memory);
    return m;
  }
};

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// --sweep-peak: per budget, the budget, the plan's simulated peak and the measured one (the
// caching allocator's, of the run alone), and the step; then the targets on them.
void print_peak_table(const std::vector<Entry>& entries, size_t fixed, double t_none,
                      const Config& config, const TrainOptions& options, bool cpu) {
  const double tokens = static_cast<double>(options.batch * config.context);
  std::printf(
      "\npeak budgets: budget, the plan's simulated peak (est. peak), the %s allocator's peak of "
      "the run\nalone (its weights, optimizer state and batch, and its steps' peak above them; "
      "the other runs\nof the sweep left out), step time (median without the first step)\n",
      cpu ? "counting CPU" : "CUDA caching");
  std::printf(
      "| run             | budget       | est. peak    | measured peak | x budget | x est.  | "
      "step ms | tokens/s |\n");
  std::printf(
      "|-----------------|--------------|--------------|---------------|----------|---------|-"
      "--------|----------|\n");
  double lowest = INFINITY, highest = 0, worst_estimate = 0;
  for (size_t i = fixed; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const double measured = static_cast<double>(e.own_peak());
    const double x_budget = measured / static_cast<double>(e.peak_budget);
    const double x_est = measured / static_cast<double>(std::max<int64_t>(1, e.plan->peak_bytes));
    char xb[16] = "-", xe[16] = "-";
    if (!cpu) {
      std::snprintf(xb, sizeof xb, "%.3f", x_budget);
      std::snprintf(xe, sizeof xe, "%.3f", x_est);
      lowest = std::min(lowest, x_budget);
      highest = std::max(highest, x_budget);
      worst_estimate = std::max(worst_estimate, std::abs(x_est - 1.0));
    }
    const double t = e.step_seconds();
    std::printf("| %-15s | %8.1f MiB | %8.1f MiB | %9.1f MiB | %8s | %7s | %7.1f | %8.0f |\n",
                e.name.c_str(), mib(e.peak_budget), mib(e.plan->peak_bytes), mib(e.own_peak()), xb,
                xe, t * 1e3, t > 0 ? tokens / t : 0.0);
  }
  std::printf("none: %.1f ms, %.0f tokens/s\n", t_none * 1e3, t_none > 0 ? tokens / t_none : 0.0);
  if (cpu) {
    std::printf(
        "  CPU: no allocator peak there; the profile's resident bytes are the model's parameters,\n"
        "  gradients and buffers only (no optimizer state, no temporaries), so the measured peak "
        "is\n  not comparable with the budget\n");
  } else if (entries.size() > fixed) {
    std::printf("  measured peak <= budget at every budget: %s (highest %.3f x budget)\n",
                highest <= 1.0 ? "yes" : "NO", highest);
    std::printf("  measured peak within 5%% of the budget at every budget: %s (%.3f to %.3f x)\n",
                lowest >= 0.95 && highest <= 1.05 ? "yes" : "no", lowest, highest);
    std::printf(
        "  simulated peak within 5%% of the measured one at every budget: %s (worst %.1f%%)\n",
        worst_estimate <= 0.05 ? "yes" : "no", worst_estimate * 100);
  }
}

}  // namespace

int run_sweep(const Config& config, const CharDataset& data, const TrainOptions& options,
              const std::filesystem::path& out, bool peak) {
  const bool cpu = !options.device.is_cuda();
  std::printf("profiling one training step...\n");
  const auto profile = profile_training_step(config, data, options);
  profile.save(out / "profile.json");
  const std::string text = profile.to_string();
  std::printf("%s\n", text.substr(0, text.find("\nops of")).c_str());

  // Budgets: the least a plan can hold, then every tenth of none's bytes above it; with peak,
  // every twentieth from half of none's simulated peak (resident + activations) to all of it.
  // The sweep checks the simulated peak against the measured one, each budget with no cap behind
  // it: no allocator headroom (a capped run, gpt --budget with --memory-fraction, keeps it).
  const auto solve = solve_options(options.device).allocator_headroom(0);
  const int64_t least = recompose::min_plan_bytes(profile, solve);
  const double lo = static_cast<double>(least) / static_cast<double>(profile.bytes_held);
  std::vector<double> fractions{lo};
  for (int percent = 10; percent <= 100; percent += 10) {
    if (percent / 100.0 > lo + 0.02) fractions.push_back(percent / 100.0);
  }
  double solve_seconds = 0;
  std::vector<Entry> entries;
  for (Policy p : kAllPolicies)
    entries.push_back({std::string(policy_name(p)), false, nullptr, 0, 0, nullptr, {}});
  const size_t fixed = entries.size();
  const int64_t none_peak = profile.resident_bytes + profile.bytes_held;
  if (peak) {
    fractions.clear();
    for (int percent = 50; percent <= 100; percent += 5) fractions.push_back(percent / 100.0);
  }
  for (double f : fractions) {
    const int64_t peak_budget = static_cast<int64_t>(f * static_cast<double>(none_peak));
    auto budget =
        peak ? recompose::Budget::peak_bytes(peak_budget)
             : (f == lo ? recompose::Budget::bytes(least) : recompose::Budget::fraction(f));
    std::shared_ptr<recompose::Plan> plan;
    try {
      plan = std::make_shared<recompose::Plan>(recompose::solve_plan(profile, budget, solve));
    } catch (const std::invalid_argument& e) {
      if (!peak) throw;
      std::printf("no plan for a peak of %.0f%%: %s\n", f * 100, e.what());
      continue;
    }
    solve_seconds = std::max(solve_seconds, plan->solve_seconds);
    char name[32];
    std::snprintf(name, sizeof name, peak ? "peak %.0f%%" : "planned %.0f%%", f * 100);
    char file[32];
    std::snprintf(file, sizeof file, "plan_%03.0f.json", f * 100);
    plan->save(out / file);
    entries.push_back({name, true, plan, f, peak ? peak_budget : 0, nullptr, {}});
  }
  for (auto& e : entries) {
    TrainOptions o = options;
    o.policy = e.planned ? Policy::Planned : *parse_policy(e.name);
    o.plan = e.plan;
    e.trainer = std::make_unique<Trainer>(config, data, o);
  }

  ProgressBar progress("sweep (" + std::to_string(entries.size()) + " runs interleaved)",
                       options.steps);
  for (int64_t step = 1; step <= options.steps; ++step) {
    in_rotated_order(step, entries.size(),
                     [&](size_t j) { entries[j].steps.push_back(entries[j].trainer->step(step)); });
    progress.update(step, "");
  }
  progress.finish();

  const Entry& none = entries.front();
  const double t_none = none.step_seconds();
  // On CPU, what swap and offload move to "host" memory stays in the same memory: it counts.
  auto effective = [&](const Entry& e) { return e.held() + (cpu ? e.swapped() : 0); };
  bool ok = true;
  double worst_loss = 0;
  const double tolerance = loss_tolerance(options.bf16);
  std::ofstream csv(out / "sweep.csv");
  csv << "kind,name,budget_bytes,budget_fraction,estimated_bytes,estimated_step_ms,held_bytes,"
         "swapped_bytes,"
         "effective_bytes,step_ms,time_x,bytes_x,best_fixed_fitting,best_fixed_time_x,final_loss,"
         "step_peak_bytes,"
         "step_peak_x,peak_budget_bytes,estimated_peak_bytes,measured_peak_bytes\n";
  std::printf(
      "\n%lld steps per run, interleaved; step time: median without the first step; x: against "
      "none\n",
      static_cast<long long>(options.steps));
  std::printf(
      "| run             | budget    | est. held | held      | %s | step peak   | peak x | est. ms "
      "| step ms | time x | best fixed fitting    | vs best |\n",
      cpu ? "held+swap" : "swapped  ");
  std::printf(
      "|-----------------|-----------|-----------|-----------|-----------|-------------|--------|--"
      "-------|---------|--------|-----------------------|---------|\n");
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const double t = e.step_seconds();
    const double loss_diff =
        std::abs(e.steps.back().loss - none.steps.back().loss) / std::abs(none.steps.back().loss);
    worst_loss = std::max(worst_loss, loss_diff);
    std::string best = "-";
    double best_x = NAN;
    char budget[16] = "-", est[16] = "-", est_ms[16] = "-";
    if (e.planned) {
      std::snprintf(budget, sizeof budget, "%.2f MiB",
                    mib(e.peak_budget > 0 ? e.peak_budget : e.plan->budget_bytes));
      std::snprintf(est, sizeof est, "%.2f MiB", mib(e.plan->bytes));
      std::snprintf(est_ms, sizeof est_ms, "%.1f", e.plan->step_seconds * 1e3);
      double best_t = INFINITY;
      for (size_t j = 0; j < fixed; ++j) {
        if (effective(entries[j]) <= e.plan->budget_bytes && entries[j].step_seconds() < best_t) {
          best_t = entries[j].step_seconds();
          best = entries[j].name;
        }
      }
      best_x = best_t / t_none;
      if (static_cast<double>(e.held()) > 1.05 * static_cast<double>(e.plan->budget_bytes))
        ok = false;
      // A peak budget on a device: the caching allocator's peak of the whole step.
      if (e.peak_budget > 0 && !cpu &&
          static_cast<double>(e.own_peak()) > 1.05 * static_cast<double>(e.peak_budget)) {
        ok = false;
      }
    }
    const double peak_x = static_cast<double>(e.step_peak()) /
                          static_cast<double>(std::max<int64_t>(1, none.step_peak()));
    std::printf(
        "| %-15s | %9s | %9s | %6.2f MiB | %6.2f MiB | %7.1f MiB | %6.3f | %7s | %7.1f | %6.3f | "
        "%-21s | %7s |\n",
        e.name.c_str(), budget, est, mib(e.held()), mib(cpu ? effective(e) : e.swapped()),
        mib(e.step_peak()), peak_x, est_ms, t * 1e3, t / t_none,
        best == "-" ? "-" : (best + " " + std::to_string(best_x).substr(0, 5)).c_str(),
        std::isfinite(best_x) ? std::to_string(t / t_none / best_x).substr(0, 5).c_str() : "-");
    csv << (e.planned ? "planned" : "fixed") << ',' << e.name << ','
        << (e.planned ? e.plan->budget_bytes : 0) << ',' << e.fraction << ','
        << (e.planned ? e.plan->bytes : 0) << ',' << (e.planned ? e.plan->step_seconds * 1e3 : 0)
        << ',' << e.held() << ',' << e.swapped() << ',' << effective(e) << ',' << t * 1e3 << ','
        << t / t_none << ','
        << static_cast<double>(effective(e)) / static_cast<double>(effective(none)) << ',' << best
        << ',' << (std::isfinite(best_x) ? best_x : 0) << ',' << e.steps.back().loss << ','
        << e.step_peak() << ',' << peak_x << ',' << e.peak_budget << ','
        << (e.planned ? e.plan->peak_bytes : 0) << ',' << e.own_peak() << '\n';
  }
  csv.close();
  if (peak) print_peak_table(entries, fixed, t_none, config, options, cpu);

  // The plot: the planner's curve and a dot per fixed policy.
  Chart chart{
      "Bytes held for backward against step time (" + std::string(cpu ? "CPU" : "CUDA") + ")",
      std::string("held for backward, MiB") + (cpu ? " (swapped bytes included on CPU)" : ""),
      "step time, x of no checkpointing",
      {}};
  Series curve{"planner", {}, {}, true, true};
  for (size_t i = fixed; i < entries.size(); ++i) {
    curve.x.push_back(mib(effective(entries[i])));
    curve.y.push_back(entries[i].step_seconds() / t_none);
  }
  chart.series.push_back(curve);
  for (size_t j = 0; j < fixed; ++j) {
    chart.series.push_back({entries[j].name,
                            {mib(effective(entries[j]))},
                            {entries[j].step_seconds() / t_none},
                            false,
                            true});
  }
  write_svg(out / "sweep.svg", chart);

  // The targets.
  std::printf("\ntargets:\n");
  std::printf("  held <= budget x 1.05 at every budget: %s\n", ok ? "yes" : "NO");
  bool on_or_below = true;
  double worst_vs_best = 0;
  for (size_t i = fixed; i < entries.size(); ++i) {
    double best_t = INFINITY;
    for (size_t j = 0; j < fixed; ++j) {
      if (effective(entries[j]) <= entries[i].plan->budget_bytes)
        best_t = std::min(best_t, entries[j].step_seconds());
    }
    if (std::isfinite(best_t)) {
      worst_vs_best = std::max(worst_vs_best, entries[i].step_seconds() / best_t);
      on_or_below = on_or_below && entries[i].step_seconds() <= best_t;
    }
  }
  std::printf("  planned step time <= best fixed policy that fits: %s (worst ratio %.3f)\n",
              on_or_below ? "yes" : "no", worst_vs_best);
  for (size_t i = fixed; i < entries.size(); ++i) {
    if (!peak && std::abs(entries[i].fraction - 0.5) < 1e-9) {
      std::printf("  at 50%% of none's bytes: step time %.3fx of none (target <= 1.08)\n",
                  entries[i].step_seconds() / t_none);
    }
  }
  // The cost model against the clock: each plan's estimated step beside its measured one.
  double worst_estimate = 0;
  for (size_t i = fixed; i < entries.size(); ++i) {
    const double measured = entries[i].step_seconds();
    if (measured > 0)
      worst_estimate =
          std::max(worst_estimate, std::abs(entries[i].plan->step_seconds / measured - 1.0));
  }
  if (entries.size() > fixed) {
    std::printf(
        "  estimated step within 10%% of the measured one at every budget: %s (worst %.1f%%)\n",
        worst_estimate <= 0.10 ? "yes" : "no", worst_estimate * 100);
  }
  const double planning = profile.profile_seconds + solve_seconds;
  std::printf(
      "  profiling + solving: %.1f ms = %.2f steps of none (target <= 3); solving %.3f ms\n",
      planning * 1e3, planning / t_none, solve_seconds * 1e3);
  std::printf("  losses: largest relative difference from none %.1e (%s)\n", worst_loss,
              worst_loss <= tolerance ? "equal" : "DIFFER");
  std::printf("wrote %s, %s, profile.json and plan_*.json\n", (out / "sweep.csv").c_str(),
              (out / "sweep.svg").c_str());
  return ok && worst_loss <= tolerance ? 0 : 1;
}

}  // namespace gpt
