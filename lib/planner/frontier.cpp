#include "frontier.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace recompose::detail {
namespace {

// The frontier keeps at most one plan per 1/kBuckets of the largest total: solving stays fast
// (modules x candidates x kBuckets) and loses at most that much of a budget.
constexpr int64_t kBuckets = 4096;

void build_frontiers(Family& family, int64_t bucket) {
  std::vector<Node> current{{family.base_bytes, 0.0, -1, -1}};
  std::vector<Node> next;
  for (const auto& mo : family.modules) {
    next.clear();
    for (size_t f = 0; f < current.size(); ++f) {
      for (size_t k = 0; k < mo.points.size(); ++k) {
        next.push_back({current[f].bytes + mo.points[k].bytes,
                        current[f].seconds + mo.points[k].seconds, static_cast<int32_t>(f),
                        static_cast<int32_t>(k)});
      }
    }
    std::sort(next.begin(), next.end(), [](const Node& a, const Node& b) {
      return std::tie(a.bytes, a.seconds, a.parent, a.point) <
             std::tie(b.bytes, b.seconds, b.parent, b.point);
    });
    std::vector<Node> front;
    for (const Node& n : next) {
      if (!front.empty() && n.seconds >= front.back().seconds) continue;  // dominated
      // Same bucket as the last kept plan (not the first plan): the faster one stays.
      if (front.size() > 1 && n.bytes / bucket == front.back().bytes / bucket) front.pop_back();
      front.push_back(n);
    }
    family.fronts.push_back(front);
    current = std::move(front);
  }
}

}  // namespace

int64_t largest_saved(const MemoryProfile& profile) {
  int64_t largest = 0;
  for (const auto& m : profile.modules) largest = std::max(largest, m.saved_bytes);
  return largest;
}

std::vector<Family> families(const MemoryProfile& profile, const CopyWindowModel* w) {
  std::vector<Family> out(w ? 3 : 1);
  out[0].modules = module_options(profile, nullptr, false);
  out[0].base_bytes = profile.other_bytes;
  if (w) {
    out[1].modules = module_options(profile, w, false);
    out[1].base_bytes = profile.other_bytes;
    out[2].modules = module_options(profile, w, true);
    out[2].base_bytes = profile.other_bytes + largest_saved(profile);
  }
  int64_t most = profile.other_bytes;
  for (const auto& m : profile.modules) most += std::max(m.saved_bytes, m.input_bytes);
  const int64_t bucket = std::max<int64_t>(1, most / kBuckets);
  for (auto& f : out) build_frontiers(f, bucket);
  return out;
}

std::vector<Final> final_frontier(const std::vector<Family>& fams) {
  std::vector<Final> all;
  for (size_t f = 0; f < fams.size(); ++f) {
    const auto& last = fams[f].fronts.back();
    for (size_t i = 0; i < last.size(); ++i) all.push_back({last[i].bytes, last[i].seconds, f, i});
  }
  std::sort(all.begin(), all.end(), [](const Final& a, const Final& b) {
    return std::tie(a.bytes, a.seconds, a.family, a.node) <
           std::tie(b.bytes, b.seconds, b.family, b.node);
  });
  std::vector<Final> out;
  for (const Final& x : all) {
    if (out.empty() || x.seconds < out.back().seconds) out.push_back(x);
  }
  return out;
}

Plan plan_at(const MemoryProfile& profile, const std::vector<Family>& fams, const Final& chosen,
             int64_t limit, const Judge& judge) {
  const Family& fam = fams[chosen.family];
  Plan plan = plan_for(profile, limit);
  plan.bytes = chosen.bytes;
  plan.step_seconds = profile.step_seconds + chosen.seconds;
  plan.modules.resize(fam.modules.size());
  size_t at = chosen.node;
  for (size_t i = fam.modules.size(); i-- > 0;) {
    const Node& n = fam.fronts[i][at];
    plan.modules[i] =
        module_plan(fam.modules[i], fam.modules[i].points[static_cast<size_t>(n.point)]);
    at = static_cast<size_t>(n.parent);
  }
  judge.finish(plan);
  return plan;
}

}  // namespace recompose::detail
