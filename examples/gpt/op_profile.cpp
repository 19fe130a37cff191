#include "op_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpt {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

struct Span {
  uint64_t start = 0, end = 0;
  bool contains(uint64_t t) const { return t >= start && t < end; }
};

// Per op name: calls and time.
struct Tally {
  int64_t calls = 0;
  uint64_t ns = 0;
};

struct Phase {
  std::string name;
  std::vector<Span> spans;
  int64_t top_ops = 0;     // top-level aten ops (not inside another aten op of their thread)
  uint64_t top_op_ns = 0;  // their host time, inclusive
  uint64_t device_ns = 0;  // device kernels and copies that started inside
  int64_t syncs = 0, mallocs = 0, memcpys = 0;
  std::map<std::string, Tally> ops;      // top-level aten ops by name
  std::map<std::string, Tally> kernels;  // device activity by name
  bool contains(uint64_t t) const {
    return std::any_of(spans.begin(), spans.end(), [t](const Span& s) { return s.contains(t); });
  }
};

std::string ms(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) * 1e-6);
  return buf;
}

void top(std::string& out, const std::map<std::string, Tally>& tallies, const char* what,
         size_t n) {
  std::vector<std::pair<std::string, Tally>> v(tallies.begin(), tallies.end());
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  char line[256];
  std::snprintf(line, sizeof line, "      %-52s %8s %10s %9s\n", what, "calls", "total ms",
                "mean us");
  out += line;
  for (size_t i = 0; i < std::min(n, v.size()); ++i) {
    const auto& [name, t] = v[i];
    std::snprintf(line, sizeof line, "      %-52.52s %8lld %10s %9.2f\n", name.c_str(),
                  static_cast<long long>(t.calls), ms(t.ns).c_str(),
                  t.calls ? static_cast<double>(t.ns) / static_cast<double>(t.calls) * 1e-3 : 0.0);
    out += line;
  }
}

}  // namespace

OpProfile::OpProfile(bool cuda) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
}

OpProfile::~OpProfile() {
  if (active_) {
    try {
      prof::disableProfiler();
    } catch (...) {
    }
  }
}

std::string OpProfile::finish(const std::filesystem::path& trace, const std::string& title) {
  active_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  result->save(trace.string());
  const std::vector<prof::KinetoEvent>& events = result->events();

  std::vector<Phase> phases(3);
  phases[0].name = "gpt::forward";
  phases[1].name = "gpt::backward";
  phases[2].name = "recompose::selective_replay";
  for (const auto& e : events) {
    for (Phase& p : phases) {
      if (e.name() == p.name) p.spans.push_back({e.startNs(), e.endNs()});
    }
  }
  // Top-level aten ops: per thread, ops not inside another aten op.
  std::vector<const prof::KinetoEvent*> host;
  for (const auto& e : events) {
    if (e.deviceType() == c10::DeviceType::CPU && e.name().rfind("aten::", 0) == 0)
      host.push_back(&e);
  }
  std::sort(host.begin(), host.end(), [](const auto* a, const auto* b) {
    return a->startThreadId() != b->startThreadId() ? a->startThreadId() < b->startThreadId()
           : a->startNs() != b->startNs()           ? a->startNs() < b->startNs()
                                                    : a->endNs() > b->endNs();
  });
  std::unordered_map<uint64_t, uint64_t> open_until;  // thread -> end of its current top op
  for (const auto* e : host) {
    uint64_t& until = open_until[e->startThreadId()];
    if (e->startNs() < until) continue;  // nested in a top-level op
    until = e->endNs();
    for (Phase& p : phases) {
      if (!p.contains(e->startNs())) continue;
      ++p.top_ops;
      p.top_op_ns += e->durationNs();
      Tally& t = p.ops[e->name()];
      ++t.calls;
      t.ns += e->durationNs();
    }
  }
  for (const auto& e : events) {
    const std::string name = e.name();
    const bool device = e.deviceType() != c10::DeviceType::CPU;
    for (Phase& p : phases) {
      if (!p.contains(e.startNs())) continue;
      if (device) {
        p.device_ns += e.durationNs();
        Tally& t = p.kernels[name];
        ++t.calls;
        t.ns += e.durationNs();
      } else if (name.find("Synchronize") != std::string::npos) {
        ++p.syncs;
      } else if (name.rfind("cudaMalloc", 0) == 0) {
        ++p.mallocs;
      } else if (name.rfind("cudaMemcpy", 0) == 0) {
        ++p.memcpys;
      }
    }
  }

  std::string out = "profile of " + title + " (Chrome trace: " + trace.string() + ")\n";
  char line[320];
  for (const Phase& p : phases) {
    uint64_t span_ns = 0;
    for (const Span& s : p.spans) span_ns += s.end - s.start;
    std::snprintf(
        line, sizeof line,
        "  %s: %zu spans, %s ms host; %lld top-level aten ops, %s ms, %.2f us each; "
        "device activity started inside %s ms; %lld synchronisations, %lld cudaMalloc, "
        "%lld cudaMemcpy\n",
        p.name.c_str(), p.spans.size(), ms(span_ns).c_str(), static_cast<long long>(p.top_ops),
        ms(p.top_op_ns).c_str(),
        p.top_ops ? static_cast<double>(p.top_op_ns) / static_cast<double>(p.top_ops) * 1e-3 : 0.0,
        ms(p.device_ns).c_str(), static_cast<long long>(p.syncs), static_cast<long long>(p.mallocs),
        static_cast<long long>(p.memcpys));
    out += line;
    if (p.spans.empty()) continue;
    top(out, p.ops, "top-level aten ops, by host time", 12);
    if (!p.kernels.empty()) top(out, p.kernels, "device activity, by device time", 8);
  }
  return out;
}

}  // namespace gpt
