// MemoryProfile as text and as JSON.
#include "json.h"

#include <recompose/memory_profile.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace recompose {
namespace {

constexpr int kProfileFormatVersion = 1;

std::string mib(int64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buffer;
}

}  // namespace

std::string MemoryProfile::to_string() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line,
                "profile on %s: %s held for backward without checkpointing (%s outside the modules), step %.2f ms, "
                "copy bandwidth %.2f GB/s, profiled in %.1f ms\n",
                device.c_str(), mib(bytes_held).c_str(), mib(other_bytes).c_str(), step_seconds * 1e3,
                copy_bandwidth / 1e9, profile_seconds * 1e3);
  s << line;
  std::snprintf(line, sizeof line, "| %-16s | %5s | %10s | %10s | %8s | %8s | %8s | %4s |\n", "module", "calls",
                "saves", "inputs", "fwd ms", "sac ms", "replay", "ops");
  s << line << "|------------------|-------|------------|------------|----------|----------|----------|------|\n";
  for (const auto& m : modules) {
    std::snprintf(line, sizeof line, "| %-16s | %5lld | %10s | %10s | %8.2f | %8.2f | %8.2f | %4zu |\n",
                  m.name.empty() ? "(root)" : m.name.c_str(), static_cast<long long>(m.calls),
                  mib(m.saved_bytes).c_str(), mib(m.input_bytes).c_str(), m.forward_seconds * 1e3,
                  m.selective_forward_seconds * 1e3, m.replay_seconds * 1e3, m.ops.size());
    s << line;
  }
  for (const auto& m : modules) {
    s << "\nops of " << (m.name.empty() ? "(root)" : m.name) << " (" << m.type << "):\n";
    for (const auto& o : m.ops) {
      std::snprintf(line, sizeof line, "  %-52s #%-2lld %10s %8.3f ms%s%s%s%s\n", o.op.c_str(),
                    static_cast<long long>(o.call_index), mib(o.output_bytes).c_str(), o.seconds * 1e3,
                    o.random ? " random" : "", o.inplace ? " in-place" : "", o.view ? " view" : "",
                    o.mutated ? " mutated-later" : "");
      s << line;
    }
  }
  return s.str();
}

std::string MemoryProfile::to_json() const {
  using detail::json::number;
  using detail::json::quote;
  auto flag = [](bool b) { return b ? "true" : "false"; };
  std::ostringstream s;
  s << "{\n  \"format\": \"recompose.profile\",\n  \"version\": " << kProfileFormatVersion << ",\n"
    << "  \"device\": " << quote(device) << ",\n  \"bytes_held\": " << bytes_held << ",\n"
    << "  \"other_bytes\": " << other_bytes << ",\n  \"step_seconds\": " << number(step_seconds) << ",\n"
    << "  \"copy_bandwidth\": " << number(copy_bandwidth) << ",\n"
    << "  \"profile_seconds\": " << number(profile_seconds) << ",\n"
    << "  \"resident_bytes\": " << resident_bytes << ",\n  \"modules\": [";
  for (size_t i = 0; i < modules.size(); ++i) {
    const auto& m = modules[i];
    s << (i ? "," : "") << "\n    {\"name\": " << quote(m.name) << ", \"type\": " << quote(m.type)
      << ", \"calls\": " << m.calls << ", \"input_bytes\": " << m.input_bytes << ", \"saved_bytes\": " << m.saved_bytes
      << ",\n     \"forward_seconds\": " << number(m.forward_seconds)
      << ", \"selective_forward_seconds\": " << number(m.selective_forward_seconds)
      << ", \"replay_seconds\": " << number(m.replay_seconds) << ",\n     \"ops\": [";
    for (size_t k = 0; k < m.ops.size(); ++k) {
      const auto& o = m.ops[k];
      s << (k ? "," : "") << "\n      {\"op\": " << quote(o.op) << ", \"call_index\": " << o.call_index
        << ", \"output_bytes\": " << o.output_bytes << ", \"seconds\": " << number(o.seconds)
        << ", \"random\": " << flag(o.random) << ", \"inplace\": " << flag(o.inplace) << ", \"view\": " << flag(o.view)
        << ", \"mutated\": " << flag(o.mutated) << "}";
    }
    s << "]}";
  }
  s << "\n  ]\n}\n";
  return s.str();
}

MemoryProfile MemoryProfile::from_json(std::string_view text) {
  const auto v = detail::json::parse(text);
  if (v.kind != detail::json::Value::Kind::Object || !v.find("format") ||
      v.at("format").string("format") != "recompose.profile") {
    throw std::invalid_argument("MemoryProfile::from_json: not a recompose profile (no \"format\": \"recompose.profile\")");
  }
  if (v.at("version").integer("version") != kProfileFormatVersion) {
    throw std::invalid_argument("MemoryProfile::from_json: profile format version " + v.at("version").text +
                                ", this recompose reads version " + std::to_string(kProfileFormatVersion));
  }
  MemoryProfile p;
  p.device = v.at("device").string("device");
  p.bytes_held = v.at("bytes_held").integer("bytes_held");
  p.other_bytes = v.at("other_bytes").integer("other_bytes");
  p.step_seconds = v.at("step_seconds").number("step_seconds");
  p.copy_bandwidth = v.at("copy_bandwidth").number("copy_bandwidth");
  p.profile_seconds = v.at("profile_seconds").number("profile_seconds");
  if (const auto* r = v.find("resident_bytes")) p.resident_bytes = r->integer("resident_bytes");  // absent before issue 27
  for (const auto& m : v.at("modules").array("modules")) {
    ModuleProfile mp;
    mp.name = m.at("name").string("name");
    mp.type = m.at("type").string("type");
    mp.calls = m.at("calls").integer("calls");
    mp.input_bytes = m.at("input_bytes").integer("input_bytes");
    mp.saved_bytes = m.at("saved_bytes").integer("saved_bytes");
    mp.forward_seconds = m.at("forward_seconds").number("forward_seconds");
    mp.selective_forward_seconds = m.at("selective_forward_seconds").number("selective_forward_seconds");
    mp.replay_seconds = m.at("replay_seconds").number("replay_seconds");
    for (const auto& o : m.at("ops").array("ops")) {
      OpProfile op;
      op.op = o.at("op").string("op");
      op.call_index = o.at("call_index").integer("call_index");
      op.output_bytes = o.at("output_bytes").integer("output_bytes");
      op.seconds = o.at("seconds").number("seconds");
      op.random = o.at("random").boolean("random");
      op.inplace = o.at("inplace").boolean("inplace");
      op.view = o.at("view").boolean("view");
      op.mutated = o.at("mutated").boolean("mutated");
      mp.ops.push_back(std::move(op));
    }
    p.modules.push_back(std::move(mp));
  }
  return p;
}

void MemoryProfile::save(const std::filesystem::path& path) const { detail::json::write_text(path, to_json()); }

MemoryProfile MemoryProfile::load(const std::filesystem::path& path) {
  return from_json(detail::json::read_text(path));
}

}  // namespace recompose
