// Plan as a table and as JSON.
#include "engine/format_bytes.h"
#include "json/json_io.h"

#include <recompose/memory_plan.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace recompose {
namespace {

// Version 2 added the trials and the planning cost; version 1 plans (without them) still load.
constexpr int kPlanFormatVersion = 2;

detail::json::Json ops_json(const std::vector<PlannedOp>& ops) {
  auto out = detail::json::Json::array();
  for (const auto& o : ops) out.push_back({{"op", o.op}, {"call_index", o.call_index}});
  return out;
}

std::vector<PlannedOp> ops_from(const detail::json::Json& module, const char* key) {
  std::vector<PlannedOp> out;
  for (const auto& o : detail::json::array(module, key)) {
    PlannedOp op;
    detail::json::read_members(o, "op", op.op, "call_index", op.call_index);
    out.push_back(std::move(op));
  }
  return out;
}

detail::json::Json trials_json(const std::vector<PlanTrial>& trials) {
  using detail::json::finite;
  auto out = detail::json::Json::array();
  for (const auto& t : trials) {
    out.push_back({{"name", t.name},
                   {"bytes", t.bytes},
                   {"step_seconds", finite(t.step_seconds)},
                   {"peak_bytes", t.peak_bytes},
                   {"measured_bytes", t.measured_bytes},
                   {"measured_peak_bytes", t.measured_peak_bytes},
                   {"measured_seconds", finite(t.measured_seconds)},
                   {"timed_steps", t.timed_steps},
                   {"chosen", t.chosen},
                   {"verdict", t.verdict},
                   {"reproduce", t.reproduce}});
  }
  return out;
}

std::vector<PlanTrial> trials_from(const detail::json::Json& plan) {
  std::vector<PlanTrial> out;
  for (const auto& j : detail::json::array(plan, "trials")) {
    PlanTrial t;
    detail::json::read_members(j, "name", t.name, "bytes", t.bytes, "step_seconds", t.step_seconds,
                               "peak_bytes", t.peak_bytes, "measured_bytes", t.measured_bytes,
                               "measured_peak_bytes", t.measured_peak_bytes, "measured_seconds",
                               t.measured_seconds, "timed_steps", t.timed_steps, "chosen", t.chosen,
                               "verdict", t.verdict, "reproduce", t.reproduce);
    out.push_back(std::move(t));
  }
  return out;
}

// The trials' table under the plan's (Plan::to_table).
void write_trials(std::ostringstream& s, const Plan& plan) {
  if (plan.trials.empty()) return;
  char line[512];
  std::snprintf(line, sizeof line,
                "candidates weighed (planning took %.1f ms, %.2f plain steps):\n"
                "| %-22s | %10s | %10s | %9s | %11s | %5s | %s\n",
                plan.planning_seconds * 1e3, plan.planning_steps, "candidate", "est. held", "held",
                "est. ms", "measured ms", "steps", "verdict");
  s << line;
  for (const auto& t : plan.trials) {
    const std::string held = t.measured_bytes >= 0 ? detail::format_mib(t.measured_bytes) : "-";
    char measured[32] = "-";
    if (t.timed_steps > 0)
      std::snprintf(measured, sizeof measured, "%.2f", t.measured_seconds * 1e3);
    std::snprintf(line, sizeof line, "| %-22s | %10s | %10s | %9.2f | %11s | %5lld | %s\n",
                  t.name.c_str(), detail::format_mib(t.bytes).c_str(), held.c_str(),
                  t.step_seconds * 1e3, measured, static_cast<long long>(t.timed_steps),
                  t.verdict.c_str());
    s << line;
  }
  for (const auto& t : plan.trials) s << "  " << t.name << ": " << t.reproduce << "\n";
}

ModuleChoice choice_from(const std::string& name) {
  constexpr ModuleChoice kChoices[] = {ModuleChoice::None, ModuleChoice::Full,
                                       ModuleChoice::Selective, ModuleChoice::Offload,
                                       ModuleChoice::FullSwapInputs};
  std::string known;  // from the same list, so that the message names every choice read
  for (ModuleChoice c : kChoices) {
    if (module_choice_name(c) == name) return c;
    known += (known.empty() ? "" : ", ") + std::string(module_choice_name(c));
  }
  throw std::invalid_argument("recompose: Plan::from_json: unknown choice '" + name +
                              "' (one of: " + known + ")");
}

}  // namespace

std::string_view module_choice_name(ModuleChoice choice) {
  switch (choice) {
    case ModuleChoice::None:
      return "none";
    case ModuleChoice::Full:
      return "full";
    case ModuleChoice::Selective:
      return "selective";
    case ModuleChoice::Offload:
      return "offload";
    case ModuleChoice::FullSwapInputs:
      return "full-swap-inputs";
  }
  return "?";
}

std::string Plan::to_table() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line, "| %-16s | %-9s | %4s | %4s | %10s | %12s |\n", "module",
                "choice", "kept", "swap", "held", "extra ms");
  s << line << "|------------------|-----------|------|------|------------|--------------|\n";
  for (const auto& m : modules) {
    std::snprintf(line, sizeof line, "| %-16s | %-9s | %4zu | %4zu | %10s | %12.2f |\n",
                  m.name.empty() ? "(root)" : m.name.c_str(),
                  std::string(module_choice_name(m.choice)).c_str(), m.save.size(), m.swap.size(),
                  detail::format_mib(m.bytes).c_str(), m.seconds * 1e3);
    s << line;
  }
  const double none = static_cast<double>(none_bytes > 0 ? none_bytes : 1);
  std::snprintf(line, sizeof line,
                "estimated: %s held for backward (%.2fx of no checkpointing, budget %s), step %.2f "
                "ms (%.3fx); "
                "solved in %.3f ms\n",
                detail::format_mib(bytes).c_str(), static_cast<double>(bytes) / none,
                detail::format_mib(budget_bytes).c_str(), step_seconds * 1e3,
                none_step_seconds > 0 ? step_seconds / none_step_seconds : 0.0,
                solve_seconds * 1e3);
  s << line;
  if (peak_bytes > 0) {
    std::snprintf(line, sizeof line, "simulated peak device memory of the step: %s\n",
                  detail::format_mib(peak_bytes).c_str());
    s << line;
  }
  s << (backward_measured
            ? "time line: each module's backward as profiled\n"
            : "time line: each module's backward assumed twice its forward (not profiled)\n");
  write_trials(s, *this);
  return s.str();
}

std::string Plan::to_json() const {
  using detail::json::finite;
  auto module_list = detail::json::Json::array();
  for (const auto& m : modules) {
    module_list.push_back({{"name", m.name},
                           {"type", m.type},
                           {"choice", std::string(module_choice_name(m.choice))},
                           {"bytes", m.bytes},
                           {"seconds", finite(m.seconds)},
                           {"save", ops_json(m.save)},
                           {"swap", ops_json(m.swap)}});
  }
  const detail::json::Json document = {{"format", "recompose.plan"},
                                       {"version", kPlanFormatVersion},
                                       {"budget_bytes", budget_bytes},
                                       {"bytes", bytes},
                                       {"step_seconds", finite(step_seconds)},
                                       {"none_bytes", none_bytes},
                                       {"none_step_seconds", finite(none_step_seconds)},
                                       {"solve_seconds", finite(solve_seconds)},
                                       {"peak_bytes", peak_bytes},
                                       {"backward_measured", backward_measured},
                                       {"planning_seconds", finite(planning_seconds)},
                                       {"planning_steps", finite(planning_steps)},
                                       {"modules", std::move(module_list)},
                                       {"trials", trials_json(trials)}};
  return detail::json::dump(document);
}

Plan Plan::from_json(std::string_view text) {
  namespace json = detail::json;
  const auto v = json::parse(text);
  if (!v.is_object() || !v.contains("format") || !v["format"].is_string() ||
      v["format"] != "recompose.plan") {
    throw std::invalid_argument(
        "recompose: Plan::from_json: not a recompose plan (no \"format\": \"recompose.plan\")");
  }
  int64_t version = 0;
  json::read(v, "version", version);
  if (version != 1 && version != kPlanFormatVersion) {
    throw std::invalid_argument("recompose: Plan::from_json: plan format version " +
                                v["version"].dump() + ", this recompose reads version " +
                                std::to_string(kPlanFormatVersion) + " (and 1)");
  }
  Plan p;
  json::read_members(v, "budget_bytes", p.budget_bytes, "bytes", p.bytes, "step_seconds",
                     p.step_seconds, "none_bytes", p.none_bytes, "none_step_seconds",
                     p.none_step_seconds, "solve_seconds", p.solve_seconds);
  if (version >= 2) {
    json::read_members(v, "peak_bytes", p.peak_bytes, "backward_measured", p.backward_measured,
                       "planning_seconds", p.planning_seconds, "planning_steps", p.planning_steps);
    p.trials = trials_from(v);
  } else {  // version 1: no trials; its earliest files lack peak_bytes and backward_measured
    if (v.contains("peak_bytes")) json::read(v, "peak_bytes", p.peak_bytes);
    if (v.contains("backward_measured")) json::read(v, "backward_measured", p.backward_measured);
  }
  for (const auto& m : json::array(v, "modules")) {
    ModulePlan mp;
    std::string choice;
    json::read_members(m, "name", mp.name, "type", mp.type, "choice", choice, "bytes", mp.bytes,
                       "seconds", mp.seconds);
    mp.choice = choice_from(choice);
    mp.save = ops_from(m, "save");
    mp.swap = ops_from(m, "swap");
    p.modules.push_back(std::move(mp));
  }
  return p;
}

void Plan::save(const std::filesystem::path& path) const {
  detail::json::write_text(path, to_json());
}

Plan Plan::load(const std::filesystem::path& path) {
  return from_json(detail::json::read_text(path));
}

}  // namespace recompose
