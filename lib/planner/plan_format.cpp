// Plan as a table and as JSON.
#include "json.h"

#include <recompose/memory_plan.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace recompose {
namespace {

constexpr int kPlanFormatVersion = 1;

std::string mib(int64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buffer;
}

std::string ops_json(const std::vector<PlannedOp>& ops) {
  std::string s = "[";
  for (size_t i = 0; i < ops.size(); ++i) {
    s += (i ? ", " : "") + std::string("{\"op\": ") + detail::json::quote(ops[i].op) +
         ", \"call_index\": " + std::to_string(ops[i].call_index) + "}";
  }
  return s + "]";
}

std::vector<PlannedOp> ops_from(const detail::json::Value& v, std::string_view what) {
  std::vector<PlannedOp> out;
  for (const auto& o : v.array(what)) out.push_back({o.at("op").string("op"), o.at("call_index").integer("call_index")});
  return out;
}

ModuleChoice choice_from(const std::string& name) {
  for (ModuleChoice c : {ModuleChoice::None, ModuleChoice::Full, ModuleChoice::Selective, ModuleChoice::Offload,
                         ModuleChoice::FullSwapInputs}) {
    if (module_choice_name(c) == name) return c;
  }
  throw std::invalid_argument("Plan::from_json: unknown choice '" + name + "' (none, full, selective, offload)");
}

}  // namespace

std::string_view module_choice_name(ModuleChoice choice) {
  switch (choice) {
    case ModuleChoice::None: return "none";
    case ModuleChoice::Full: return "full";
    case ModuleChoice::Selective: return "selective";
    case ModuleChoice::Offload: return "offload";
    case ModuleChoice::FullSwapInputs: return "full-swap-inputs";
  }
  return "?";
}

std::string Plan::to_table() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line, "| %-16s | %-9s | %4s | %4s | %10s | %12s |\n", "module", "choice", "kept", "swap",
                "held", "extra ms");
  s << line << "|------------------|-----------|------|------|------------|--------------|\n";
  for (const auto& m : modules) {
    std::snprintf(line, sizeof line, "| %-16s | %-9s | %4zu | %4zu | %10s | %12.2f |\n",
                  m.name.empty() ? "(root)" : m.name.c_str(), std::string(module_choice_name(m.choice)).c_str(),
                  m.save.size(), m.swap.size(), mib(m.bytes).c_str(), m.seconds * 1e3);
    s << line;
  }
  const double none = static_cast<double>(none_bytes > 0 ? none_bytes : 1);
  std::snprintf(line, sizeof line,
                "estimated: %s held for backward (%.2fx of no checkpointing, budget %s), step %.2f ms (%.3fx); "
                "solved in %.3f ms\n",
                mib(bytes).c_str(), static_cast<double>(bytes) / none, mib(budget_bytes).c_str(), step_seconds * 1e3,
                none_step_seconds > 0 ? step_seconds / none_step_seconds : 0.0, solve_seconds * 1e3);
  s << line;
  if (peak_bytes > 0) {
    std::snprintf(line, sizeof line, "simulated peak device memory of the step: %s\n", mib(peak_bytes).c_str());
    s << line;
  }
  return s.str();
}

std::string Plan::to_json() const {
  using detail::json::number;
  using detail::json::quote;
  std::ostringstream s;
  s << "{\n  \"format\": \"recompose.plan\",\n  \"version\": " << kPlanFormatVersion << ",\n"
    << "  \"budget_bytes\": " << budget_bytes << ",\n  \"bytes\": " << bytes << ",\n"
    << "  \"step_seconds\": " << number(step_seconds) << ",\n  \"none_bytes\": " << none_bytes << ",\n"
    << "  \"none_step_seconds\": " << number(none_step_seconds) << ",\n"
    << "  \"solve_seconds\": " << number(solve_seconds) << ",\n  \"peak_bytes\": " << peak_bytes << ",\n"
    << "  \"modules\": [";
  for (size_t i = 0; i < modules.size(); ++i) {
    const auto& m = modules[i];
    s << (i ? "," : "") << "\n    {\"name\": " << quote(m.name) << ", \"type\": " << quote(m.type)
      << ", \"choice\": " << quote(module_choice_name(m.choice)) << ", \"bytes\": " << m.bytes
      << ", \"seconds\": " << number(m.seconds) << ",\n     \"save\": " << ops_json(m.save)
      << ",\n     \"swap\": " << ops_json(m.swap) << "}";
  }
  s << "\n  ]\n}\n";
  return s.str();
}

Plan Plan::from_json(std::string_view text) {
  const auto v = detail::json::parse(text);
  if (v.kind != detail::json::Value::Kind::Object || !v.find("format") ||
      v.at("format").string("format") != "recompose.plan") {
    throw std::invalid_argument("Plan::from_json: not a recompose plan (no \"format\": \"recompose.plan\")");
  }
  if (v.at("version").integer("version") != kPlanFormatVersion) {
    throw std::invalid_argument("Plan::from_json: plan format version " + v.at("version").text +
                                ", this recompose reads version " + std::to_string(kPlanFormatVersion));
  }
  Plan p;
  p.budget_bytes = v.at("budget_bytes").integer("budget_bytes");
  p.bytes = v.at("bytes").integer("bytes");
  p.step_seconds = v.at("step_seconds").number("step_seconds");
  p.none_bytes = v.at("none_bytes").integer("none_bytes");
  p.none_step_seconds = v.at("none_step_seconds").number("none_step_seconds");
  p.solve_seconds = v.at("solve_seconds").number("solve_seconds");
  if (const auto* peak = v.find("peak_bytes")) p.peak_bytes = peak->integer("peak_bytes");  // absent before issue 27
  for (const auto& m : v.at("modules").array("modules")) {
    ModulePlan mp;
    mp.name = m.at("name").string("name");
    mp.type = m.at("type").string("type");
    mp.choice = choice_from(m.at("choice").string("choice"));
    mp.bytes = m.at("bytes").integer("bytes");
    mp.seconds = m.at("seconds").number("seconds");
    mp.save = ops_from(m.at("save"), "save");
    mp.swap = ops_from(m.at("swap"), "swap");
    p.modules.push_back(std::move(mp));
  }
  return p;
}

void Plan::save(const std::filesystem::path& path) const { detail::json::write_text(path, to_json()); }

Plan Plan::load(const std::filesystem::path& path) { return from_json(detail::json::read_text(path)); }

}  // namespace recompose
