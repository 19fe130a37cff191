#include "planner_targets.h"

#include <recompose/hooks/forward_hooks.h>

#include <stdexcept>

namespace recompose::detail {
namespace {

void outermost_annotated(torch::nn::Module& m, const std::string& path,
                         std::vector<PlannerTarget>& out) {
  for (const auto& item : m.named_children()) {
    const std::string child = path.empty() ? item.key() : path + "." + item.key();
    if (hooks::has_annotated_forward(*item.value())) {
      out.push_back({child, item.value()});
    } else {
      outermost_annotated(*item.value(), child, out);
    }
  }
}

bool inside(const std::string& outer, const std::string& inner) {
  return outer.empty() ||
         (inner.size() > outer.size() && inner.starts_with(outer) && inner[outer.size()] == '.');
}

}  // namespace

std::shared_ptr<torch::nn::Module> find_module(torch::nn::Module& root, const std::string& path) {
  if (path.empty()) return root.shared_from_this();
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (item.key() == path) return item.value();
  }
  return nullptr;
}

std::vector<PlannerTarget> planner_targets(torch::nn::Module& root,
                                           const std::vector<std::string>& paths) {
  std::vector<PlannerTarget> out;
  if (paths.empty()) {
    outermost_annotated(root, "", out);
    if (out.empty() && hooks::has_annotated_forward(root))
      out.push_back({"", root.shared_from_this()});
    if (out.empty()) {
      throw std::invalid_argument(
          "recompose: memory planner: no module of " + root.name() +
          "'s tree has a forward annotated with RECOMPOSE_FORWARD, so none can be "
          "checkpointed");
    }
    return out;
  }
  for (const auto& path : paths) {
    auto m = find_module(root, path);
    if (!m)
      throw std::invalid_argument("recompose: memory planner: no module '" + path + "' in " +
                                  root.name());
    if (!hooks::has_annotated_forward(*m)) {
      throw std::invalid_argument("recompose: memory planner: module '" + path + "' (" + m->name() +
                                  ") has no forward annotated with RECOMPOSE_FORWARD");
    }
    for (const auto& other : out) {
      if (other.name == path)
        throw std::invalid_argument("recompose: memory planner: module '" + path +
                                    "' is listed twice");
      if (inside(other.name, path) || inside(path, other.name)) {
        throw std::invalid_argument("recompose: memory planner: modules '" + other.name +
                                    "' and '" + path +
                                    "' are nested; list modules that do not contain each other");
      }
    }
    out.push_back({path, m});
  }
  return out;
}

}  // namespace recompose::detail
