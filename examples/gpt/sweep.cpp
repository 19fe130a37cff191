#include "sweep.h"

#include "compare.h"
#include "offload_link.h"
#include "planning.h"
#include "plot.h"
#include "progress.h"
#include "reference_curves.h"

#include <recompose/planner.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
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
  double compute_seconds() const { return median_compute_seconds(steps); }  // fwd + bwd
  int64_t held() const {
    int64_t m = 0;
    for (const auto& r : steps) m = std::max(m, r.bytes_held);
    return m;
  }
  int64_t swapped() const { return median_bytes_moved(steps); }  // a step's, the median
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

// The candidates a plan's choice weighed (the trials' table of Plan::to_table, without the
// lines that reproduce them: those are in the plan's JSON).
void print_trials(const std::string& name, const recompose::Plan& plan) {
  std::string chosen = "?";
  for (const auto& t : plan.trials) {
    if (t.chosen) chosen = t.name;
  }
  std::printf("%s: budget %.2f MiB, chose %s (solving %.1f ms)\n", name.c_str(),
              mib(plan.budget_bytes), chosen.c_str(), plan.solve_seconds * 1e3);
  const std::string table = plan.to_table();
  size_t at = table.find("candidates weighed");
  if (at == std::string::npos) return;
  while (at < table.size()) {
    const size_t end = std::min(table.find('\n', at), table.size());
    const std::string_view line(table.data() + at, end - at);
    if (!line.starts_with("candidates weighed") && !line.starts_with("|")) break;
    std::printf("  %.*s\n", static_cast<int>(line.size()), line.data());
    at = end + 1;
  }
}

std::string chosen_candidate(const recompose::Plan& plan) {
  for (const auto& t : plan.trials) {
    if (t.chosen) return t.name;
  }
  return "";
}

// A CSV field: empty where there is no figure.
std::string field(double v) {
  if (!std::isfinite(v)) return "";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", v);
  return buffer;
}

// A table cell: "-" where there is no figure.
std::string cell(double v, const char* format = "%.3f") {
  if (!std::isfinite(v)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

// A plan's figures for the targets.
struct PlannedRow {
  std::string name;
  double fraction = 0;        // its budget, of none's bytes (--sweep-peak: of none's peak)
  double time_x = 0;          // its measured step, x of none's
  std::string best_fixed;     // the fastest fixed policy that fits its budget; empty: none fits
  double best_fixed_x = NAN;  // its step, x of none's
  double line_x = NAN, hull_x = NAN;  // the straight line none -> full and the hull, at its h
  double estimate_error = 0;          // estimated step / measured forward + backward - 1
  double ratio_error = 0;     // the same of both as ratios to none's step (optimizer left out)
  double planning_steps = 0;  // profiling, solving and trials, in plain steps (Plan's)
};

const char* met(bool yes) { return yes ? "met" : "missed"; }

// The targets for the planner (benchmark figures, never the exit status).
void print_targets(const std::vector<PlannedRow>& rows, bool cpu, bool peak, double profile_steps) {
  if (rows.empty()) return;
  const PlannedRow* worst_best = nullptr;
  for (const auto& r : rows) {
    if (std::isfinite(r.best_fixed_x) &&
        (!worst_best || r.time_x / r.best_fixed_x > worst_best->time_x / worst_best->best_fixed_x))
      worst_best = &r;
  }
  if (worst_best) {
    const double x = worst_best->time_x / worst_best->best_fixed_x;
    std::printf(
        "  planner's measured step at most 1.01x the best fixed policy that fits that budget, at "
        "every budget: %s (worst %.3fx, at %s: %s %.3fx of none, the plan %.3fx)\n",
        met(x <= 1.01), x, worst_best->name.c_str(), worst_best->best_fixed.c_str(),
        worst_best->best_fixed_x, worst_best->time_x);
  } else {
    std::printf(
        "  planner's measured step at most 1.01x the best fixed policy that fits that budget: no "
        "fixed policy fits any budget\n");
  }
  const double tolerance = cpu ? 0.05 : 0.10;
  const PlannedRow* worst_est = &rows.front();
  const PlannedRow* worst_ratio = &rows.front();
  for (const auto& r : rows) {
    if (std::abs(r.estimate_error) > std::abs(worst_est->estimate_error)) worst_est = &r;
    if (std::abs(r.ratio_error) > std::abs(worst_ratio->ratio_error)) worst_ratio = &r;
  }
  std::printf(
      "  estimates within %.0f%% of the measured step (5%% on CPU, 10%% on a device), at every "
      "budget: %s (worst %+.1f%%, at %s, against forward + backward; as ratios to none's step: "
      "worst "
      "%+.1f%%, at %s)\n",
      tolerance * 100, met(std::abs(worst_est->estimate_error) <= tolerance),
      worst_est->estimate_error * 100, worst_est->name.c_str(), worst_ratio->ratio_error * 100,
      worst_ratio->name.c_str());
  if (!peak) {
    const auto half = std::find_if(rows.begin(), rows.end(), [](const PlannedRow& r) {
      return std::abs(r.fraction - 0.5) < 1e-9;
    });
    if (half == rows.end()) {
      std::printf("  at 50%% of the bytes: no 50%% budget in this sweep\n");
    } else {
      std::printf("  at 50%% of the bytes: at most 1.12x of none: %s (%.3fx)\n",
                  met(half->time_x <= 1.12), half->time_x);
      const double vs_line = half->time_x / half->line_x;
      std::printf(
          "  at 50%% of the bytes: at least 3%% below the straight line none -> full: %s (%.3fx "
          "the line, %.1f%% below; the line %.3fx of none there)\n",
          met(vs_line <= 0.97), vs_line, (1 - vs_line) * 100, half->line_x);
    }
  }
  const PlannedRow* costliest = &rows.front();
  for (const auto& r : rows) {
    if (r.planning_steps > costliest->planning_steps) costliest = &r;
  }
  // Plan::planning_steps counts the profile (one for the whole sweep, counted in every budget's).
  const double total = costliest->planning_steps;
  std::printf(
      "  profiling + solving + trials at most 6 plain steps: %s (%.2f, the largest of the "
      "budgets, at %s: the profile %.2f + solving and trials %.2f)\n",
      met(total <= 6), total, costliest->name.c_str(), profile_steps, total - profile_steps);
}

}  // namespace

int run_sweep(const Config& config, const CharDataset& data, const TrainOptions& options,
              const std::filesystem::path& out, bool peak) {
  const bool cpu = !options.device.is_cuda();
  std::printf("profiling one training step...\n");
  auto planning = std::make_unique<PlanningStep>(config, data, options);
  const recompose::MemoryProfile profile = planning->profile();
  profile.save(out / "profile.json");
  const std::string text = profile.to_string();
  std::printf("%s\n", text.substr(0, text.find("\nops of")).c_str());
  const double profile_steps =
      profile.step_seconds > 0 ? profile.profile_seconds / profile.step_seconds : 0.0;

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
  std::vector<Entry> entries;
  for (Policy p : kAllPolicies)
    entries.push_back({std::string(policy_name(p)), false, nullptr, 0, 0, nullptr, {}});
  const size_t fixed = entries.size();
  const int64_t none_peak = profile.resident_bytes + profile.bytes_held;
  if (peak) {
    fractions.clear();
    for (int percent = 50; percent <= 100; percent += 5) fractions.push_back(percent / 100.0);
  }
  // Each budget's plan chosen by measurement on the one model and step the profile ran
  // (recompose::choose_plan: the candidates the estimates rank first, tried for real steps).
  std::printf(
      "\nchoosing a plan per budget (choose_plan: candidates tried on the profiled model)\n");
  for (double f : fractions) {
    const int64_t peak_budget = static_cast<int64_t>(f * static_cast<double>(none_peak));
    auto budget =
        peak ? recompose::Budget::peak_bytes(peak_budget)
             : (f == lo ? recompose::Budget::bytes(least) : recompose::Budget::fraction(f));
    char name[32];
    std::snprintf(name, sizeof name, peak ? "peak %.0f%%" : "planned %.0f%%", f * 100);
    std::shared_ptr<recompose::Plan> plan;
    try {
      plan = std::make_shared<recompose::Plan>(planning->choose(budget, solve));
    } catch (const std::invalid_argument& e) {
      if (!peak) throw;
      std::printf("no plan for a peak of %.0f%%: %s\n", f * 100, e.what());
      continue;
    }
    print_trials(name, *plan);
    char file[32];
    std::snprintf(file, sizeof file, "plan_%03.0f.json", f * 100);
    plan->save(out / file);
    entries.push_back({name, true, plan, f, peak ? peak_budget : 0, nullptr, {}});
  }
  planning.reset();  // its model: not beside the trainers'
  for (auto& e : entries) {
    TrainOptions o = options;
    o.phase_times = true;  // forward + backward apart from the optimizer: what estimates price
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
  auto time_x = [&](const Entry& e) { return e.step_seconds() / t_none; };
  // h: the bytes held (swapped ones too on CPU) as a fraction of none's.
  auto held_fraction = [&](const Entry& e) {
    return static_cast<double>(effective(e)) /
           static_cast<double>(std::max<int64_t>(1, effective(none)));
  };
  // The yardsticks at a run's h: the straight line none -> full, and the lower hull of every
  // fixed policy's (h, T), none and full included (reference_curves.h).
  const auto full =
      std::find_if(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(fixed),
                   [](const Entry& e) { return e.name == "full"; });
  const double h_full = held_fraction(*full), t_full = time_x(*full);
  std::vector<Point> fixed_points;
  for (size_t j = 0; j < fixed; ++j)
    fixed_points.push_back({held_fraction(entries[j]), time_x(entries[j])});
  const std::vector<Point> hull = lower_hull(fixed_points);
  auto line_at = [&](const Entry& e) {
    return straight_line_time(held_fraction(e), h_full, t_full);
  };
  auto hull_at = [&](const Entry& e) { return hull_time(hull, held_fraction(e)); };
  // The fastest fixed policy whose bytes fit a plan's budget: its index, or `fixed` when none does.
  auto best_fixed = [&](const Entry& e) {
    size_t best = fixed;
    for (size_t j = 0; j < fixed; ++j) {
      if (effective(entries[j]) <= e.plan->budget_bytes &&
          (best == fixed || entries[j].step_seconds() < entries[best].step_seconds()))
        best = j;
    }
    return best;
  };

  bool ok = true;
  double worst_loss = 0;
  const double tolerance = loss_tolerance(options.bf16);
  std::ofstream csv(out / "sweep.csv");
  csv << "kind,name,budget_bytes,budget_fraction,estimated_bytes,estimated_step_ms,held_bytes,"
         "swapped_bytes,"
         "effective_bytes,step_ms,time_x,bytes_x,best_fixed_fitting,best_fixed_time_x,final_loss,"
         "step_peak_bytes,"
         "step_peak_x,peak_budget_bytes,estimated_peak_bytes,measured_peak_bytes,"
         "estimated_over_measured,estimated_time_x,line_time_x,hull_time_x,planned_over_line,"
         "planned_over_hull,planning_steps,chosen_candidate,compute_ms\n";
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
      const size_t b = best_fixed(e);
      if (b < fixed) {
        best = entries[b].name;
        best_x = time_x(entries[b]);
      }
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
        best == "-" ? "-" : (best + " " + cell(best_x)).c_str(), cell(t / t_none / best_x).c_str());
    const double nan = NAN;
    csv << (e.planned ? "planned" : "fixed") << ',' << e.name << ','
        << (e.planned ? e.plan->budget_bytes : 0) << ',' << e.fraction << ','
        << (e.planned ? e.plan->bytes : 0) << ',' << (e.planned ? e.plan->step_seconds * 1e3 : 0)
        << ',' << e.held() << ',' << e.swapped() << ',' << effective(e) << ',' << t * 1e3 << ','
        << t / t_none << ',' << held_fraction(e) << ',' << best << ','
        << (std::isfinite(best_x) ? best_x : 0) << ',' << e.steps.back().loss << ','
        << e.step_peak() << ',' << peak_x << ',' << e.peak_budget << ','
        << (e.planned ? e.plan->peak_bytes : 0) << ',' << e.own_peak() << ','
        << field(e.planned ? e.plan->step_seconds / e.compute_seconds() : nan) << ','
        << field(e.planned ? e.plan->step_seconds / e.plan->none_step_seconds : nan) << ','
        << field(e.planned ? line_at(e) : nan) << ',' << field(e.planned ? hull_at(e) : nan) << ','
        << field(e.planned ? time_x(e) / line_at(e) : nan) << ','
        << field(e.planned ? time_x(e) / hull_at(e) : nan) << ','
        << field(e.planned ? e.plan->planning_steps : nan) << ','
        << (e.planned ? chosen_candidate(*e.plan) : "") << ',' << e.compute_seconds() * 1e3 << '\n';
  }
  csv.close();

  // The planned runs against the yardsticks, and what choosing each plan cost.
  std::printf(
      "\nthe plans against the straight line none -> full (at the run's held fraction h: "
      "1 + (T_full - 1)(1 - h)/(1 - h_full),\nT_full %.3f at h_full %.3f) and the lower hull of "
      "the fixed policies' (h, T); est./meas.: the plan's\nestimated step over the measured one "
      "(forward + backward, the optimizer left out); planning: profiling, solving and trials, "
      "in\nplain steps\n",
      t_full, h_full);
  std::printf(
      "| run             | h     | time x | line x | vs line | hull x | vs hull | est. ms | step "
      "ms "
      "| est./meas. | planning | chosen                 |\n");
  std::printf(
      "|-----------------|-------|--------|--------|---------|--------|---------|---------|--------"
      "-|------------|----------|------------------------|\n");
  for (size_t i = fixed; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    std::printf(
        "| %-15s | %5.3f | %6.3f | %6s | %7s | %6s | %7s | %7.1f | %7.1f | %10.3f | %8.2f | %-22s "
        "|\n",
        e.name.c_str(), held_fraction(e), time_x(e), cell(line_at(e)).c_str(),
        cell(time_x(e) / line_at(e)).c_str(), cell(hull_at(e)).c_str(),
        cell(time_x(e) / hull_at(e)).c_str(), e.plan->step_seconds * 1e3, e.step_seconds() * 1e3,
        e.plan->step_seconds / e.compute_seconds(), e.plan->planning_steps,
        chosen_candidate(*e.plan).c_str());
  }
  if (peak) print_peak_table(entries, fixed, t_none, config, options, cpu);

  // The plot: the planner's curve, a dot per fixed policy, and the two yardsticks.
  Chart chart{
      "Bytes held for backward against step time (" + std::string(cpu ? "CPU" : "CUDA") + ")",
      std::string("held for backward, MiB") + (cpu ? " (swapped bytes included on CPU)" : ""),
      "step time, x of no checkpointing",
      {}};
  Series curve{"planner", {}, {}, true, true};
  for (size_t i = fixed; i < entries.size(); ++i) {
    curve.x.push_back(mib(effective(entries[i])));
    curve.y.push_back(time_x(entries[i]));
  }
  chart.series.push_back(curve);
  for (size_t j = 0; j < fixed; ++j) {
    chart.series.push_back(
        {entries[j].name, {mib(effective(entries[j]))}, {time_x(entries[j])}, false, true});
  }
  const double none_mib = mib(effective(none));
  Series line{"line none -> full", {none_mib, mib(effective(*full))}, {1.0, t_full}, true, false};
  line.color = "#17becf";  // not the palette's: the fixed policies have those
  line.dash = "6 4";
  line.width = 1.5;
  chart.series.push_back(line);
  Series lower{"fixed policies' hull", {}, {}, true, false};
  for (const Point& p : hull) {
    lower.x.push_back(p.h * none_mib);
    lower.y.push_back(p.t);
  }
  lower.color = "#000000";
  lower.dash = "2 3";
  lower.width = 1.5;
  chart.series.push_back(lower);
  write_svg(out / "sweep.svg", chart);

  std::vector<PlannedRow> rows;
  for (size_t i = fixed; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    PlannedRow r;
    r.name = e.name;
    r.fraction = e.fraction;
    r.time_x = time_x(e);
    if (const size_t b = best_fixed(e); b < fixed) {
      r.best_fixed = entries[b].name;
      r.best_fixed_x = time_x(entries[b]);
    }
    r.line_x = line_at(e);
    r.hull_x = hull_at(e);
    r.estimate_error = e.plan->step_seconds / e.compute_seconds() - 1;
    r.ratio_error = e.plan->step_seconds / e.plan->none_step_seconds / time_x(e) - 1;
    r.planning_steps = e.plan->planning_steps;
    rows.push_back(r);
  }
  std::printf(
      "\ntargets (benchmark figures; the exit status is about the losses and held <= budget x "
      "1.05):\n");
  std::printf("  held <= budget x 1.05 at every budget: %s\n", ok ? "yes" : "NO");
  print_targets(rows, cpu, peak, profile_steps);
  std::printf("  losses: largest relative difference from none %.1e (%s)\n", worst_loss,
              worst_loss <= tolerance ? "equal" : "DIFFER");
  std::printf("wrote %s, %s, profile.json and plan_*.json\n", (out / "sweep.csv").c_str(),
              (out / "sweep.svg").c_str());
  return ok && worst_loss <= tolerance ? 0 : 1;
}

}  // namespace gpt
