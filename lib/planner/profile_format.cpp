// MemoryProfile as text and as JSON.
#include "engine/format_bytes.h"
#include "json/json_io.h"

#include <recompose/memory_profile.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace recompose {
namespace {

// Version 2 writes every member and reads them all; version 1 files (before the profile measured
// backward, shared inputs, kept draws and the replay's dependencies) lack some of them, which read
// as absent: no input shared, no draw kept, recomputations taken as reruns, backward unmeasured,
// no dependency recorded.
constexpr int kProfileFormatVersion = 2;

// A member version 1 may lack: read if present, else left as it is.
template <class T>
void read_if_present(const detail::json::Json& object, const char* key, T& out) {
  if (object.contains(key)) detail::json::read(object, key, out);
}

OpProfile op_from(const detail::json::Json& o, int64_t version) {
  namespace json = detail::json;
  OpProfile op;
  json::read_members(o, "op", op.op, "call_index", op.call_index, "output_bytes", op.output_bytes,
                     "seconds", op.seconds, "random", op.random, "inplace", op.inplace, "view",
                     op.view, "mutated", op.mutated);
  if (version >= 2) {
    json::read_members(o, "carries_write", op.carries_write, "saved_for_backward",
                       op.saved_for_backward);
  } else {
    read_if_present(o, "carries_write", op.carries_write);
    read_if_present(o, "saved_for_backward", op.saved_for_backward);
  }
  if (version >= 2 || o.contains("reads")) {
    for (const auto& r : json::array(o, "reads")) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0) {
        throw std::invalid_argument(
            "recompose: MemoryProfile::from_json: an op's reads must be op indices, got " +
            r.dump());
      }
      op.reads.push_back(r.get<int64_t>());
    }
  }
  return op;
}

ModuleProfile module_from(const detail::json::Json& m, int64_t version) {
  namespace json = detail::json;
  ModuleProfile mp;
  json::read_members(m, "name", mp.name, "type", mp.type, "calls", mp.calls, "input_bytes",
                     mp.input_bytes, "saved_bytes", mp.saved_bytes, "forward_seconds",
                     mp.forward_seconds, "selective_forward_seconds", mp.selective_forward_seconds,
                     "replay_seconds", mp.replay_seconds);
  if (version >= 2) {
    json::read_members(m, "shared_input_bytes", mp.shared_input_bytes, "draw_bytes", mp.draw_bytes,
                       "replayed", mp.replayed, "backward_seconds", mp.backward_seconds,
                       "dependencies_recorded", mp.dependencies_recorded);
  } else {
    read_if_present(m, "shared_input_bytes", mp.shared_input_bytes);
    read_if_present(m, "draw_bytes", mp.draw_bytes);
    read_if_present(m, "replayed", mp.replayed);
    read_if_present(m, "backward_seconds", mp.backward_seconds);
    read_if_present(m, "dependencies_recorded", mp.dependencies_recorded);
  }
  for (const auto& o : json::array(m, "ops")) mp.ops.push_back(op_from(o, version));
  for (size_t k = 0; k < mp.ops.size(); ++k) {
    for (const int64_t r : mp.ops[k].reads) {
      if (r >= static_cast<int64_t>(mp.ops.size()) || r == static_cast<int64_t>(k)) {
        throw std::invalid_argument("recompose: MemoryProfile::from_json: module '" + mp.name +
                                    "': op " + std::to_string(k) + " reads op " +
                                    std::to_string(r) + ", not another op of " +
                                    std::to_string(mp.ops.size()));
      }
    }
  }
  return mp;
}

}  // namespace

bool MemoryProfile::backward_measured() const {
  return !modules.empty() &&
         std::all_of(modules.begin(), modules.end(),
                     [](const ModuleProfile& m) { return m.backward_seconds > 0; });
}

std::string MemoryProfile::to_string() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line,
                "profile on %s: %s held for backward without checkpointing (%s outside the "
                "modules), step %.2f ms, "
                "copy bandwidth %.2f GB/s, profiled in %.1f ms\n",
                device.c_str(), detail::format_mib(bytes_held).c_str(),
                detail::format_mib(other_bytes).c_str(), step_seconds * 1e3, copy_bandwidth / 1e9,
                profile_seconds * 1e3);
  s << line;
  s << (backward_measured() ? "backward: measured per module\n"
                            : "backward: not measured per module, assumed twice the forward\n");
  std::snprintf(line, sizeof line,
                "| %-16s | %5s | %10s | %10s | %8s | %8s | %8s | %-6s | %8s | %4s |\n", "module",
                "calls", "saves", "inputs", "fwd ms", "bwd ms", "sac ms", "recomp", "ms", "ops");
  s << line
    << "|------------------|-------|------------|------------|----------|----------|----------|----"
       "----|----------|------|\n";
  for (const auto& m : modules) {
    std::snprintf(line, sizeof line,
                  "| %-16s | %5lld | %10s | %10s | %8.2f | %8.2f | %8.2f | %-6s | %8.2f | %4zu |\n",
                  m.name.empty() ? "(root)" : m.name.c_str(), static_cast<long long>(m.calls),
                  detail::format_mib(m.saved_bytes).c_str(),
                  detail::format_mib(m.input_bytes).c_str(), m.forward_seconds * 1e3,
                  m.backward_seconds * 1e3, m.selective_forward_seconds * 1e3,
                  m.replayed ? "replay" : "rerun", m.replay_seconds * 1e3, m.ops.size());
    s << line;
  }
  for (const auto& m : modules) {
    s << "\nops of " << (m.name.empty() ? "(root)" : m.name) << " (" << m.type << "):\n";
    for (size_t k = 0; k < m.ops.size(); ++k) {
      const OpProfile& o = m.ops[k];
      std::snprintf(
          line, sizeof line, "  %3zu %-52s #%-2lld %10s %8.3f ms%s%s%s%s\n", k, o.op.c_str(),
          static_cast<long long>(o.call_index), detail::format_mib(o.output_bytes).c_str(),
          o.seconds * 1e3, o.random ? " random" : "", o.inplace ? " in-place" : "",
          o.view ? " view" : "",
          o.mutated ? (o.carries_write ? " mutated-later (carried)" : " mutated-later") : "");
      s << line;
      if (m.dependencies_recorded && (o.saved_for_backward || !o.reads.empty())) {
        s << "      " << (o.saved_for_backward ? "saved for backward" : "");
        if (!o.reads.empty()) {
          s << (o.saved_for_backward ? "; " : "") << "reads ops";
          for (const int64_t r : o.reads) s << ' ' << r;
        }
        s << '\n';
      }
    }
  }
  return s.str();
}

std::string MemoryProfile::to_json() const {
  using detail::json::finite;
  using detail::json::Json;
  auto module_list = Json::array();
  for (const auto& m : modules) {
    auto op_list = Json::array();
    for (const auto& o : m.ops) {
      op_list.push_back({{"op", o.op},
                         {"call_index", o.call_index},
                         {"output_bytes", o.output_bytes},
                         {"seconds", finite(o.seconds)},
                         {"random", o.random},
                         {"inplace", o.inplace},
                         {"view", o.view},
                         {"mutated", o.mutated},
                         {"carries_write", o.carries_write},
                         {"reads", o.reads},
                         {"saved_for_backward", o.saved_for_backward}});
    }
    module_list.push_back({{"name", m.name},
                           {"type", m.type},
                           {"calls", m.calls},
                           {"input_bytes", m.input_bytes},
                           {"shared_input_bytes", m.shared_input_bytes},
                           {"draw_bytes", m.draw_bytes},
                           {"saved_bytes", m.saved_bytes},
                           {"forward_seconds", finite(m.forward_seconds)},
                           {"selective_forward_seconds", finite(m.selective_forward_seconds)},
                           {"replay_seconds", finite(m.replay_seconds)},
                           {"replayed", m.replayed},
                           {"backward_seconds", finite(m.backward_seconds)},
                           {"dependencies_recorded", m.dependencies_recorded},
                           {"ops", std::move(op_list)}});
  }
  const Json document = {{"format", "recompose.profile"},
                         {"version", kProfileFormatVersion},
                         {"device", device},
                         {"bytes_held", bytes_held},
                         {"other_bytes", other_bytes},
                         {"step_seconds", finite(step_seconds)},
                         {"copy_bandwidth", finite(copy_bandwidth)},
                         {"profile_seconds", finite(profile_seconds)},
                         {"resident_bytes", resident_bytes},
                         {"modules", std::move(module_list)}};
  return detail::json::dump(document);
}

MemoryProfile MemoryProfile::from_json(std::string_view text) {
  namespace json = detail::json;
  const auto v = json::parse(text);
  if (!v.is_object() || !v.contains("format") || !v["format"].is_string() ||
      v["format"] != "recompose.profile") {
    throw std::invalid_argument(
        "recompose: MemoryProfile::from_json: not a recompose profile (no \"format\": "
        "\"recompose.profile\")");
  }
  int64_t version = 0;
  json::read(v, "version", version);
  if (version != 1 && version != kProfileFormatVersion) {
    throw std::invalid_argument("recompose: MemoryProfile::from_json: profile format version " +
                                v["version"].dump() + ", this recompose reads version " +
                                std::to_string(kProfileFormatVersion) + " (and 1)");
  }
  MemoryProfile p;
  json::read_members(v, "device", p.device, "bytes_held", p.bytes_held, "other_bytes",
                     p.other_bytes, "step_seconds", p.step_seconds, "copy_bandwidth",
                     p.copy_bandwidth, "profile_seconds", p.profile_seconds);
  if (version >= 2)
    json::read(v, "resident_bytes", p.resident_bytes);
  else
    read_if_present(v, "resident_bytes", p.resident_bytes);
  for (const auto& m : json::array(v, "modules")) p.modules.push_back(module_from(m, version));
  return p;
}

void MemoryProfile::save(const std::filesystem::path& path) const {
  detail::json::write_text(path, to_json());
}

MemoryProfile MemoryProfile::load(const std::filesystem::path& path) {
  return from_json(detail::json::read_text(path));
}

}  // namespace recompose
