// Which modules of a model the planner profiles and plans for.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace recompose::detail {

struct PlannerTarget {
  std::string name;  // path from the root, as named_modules() spells it ("" for the root)
  std::shared_ptr<torch::nn::Module> module;
};

// The modules named by `paths` or, when it is empty, the annotated modules of `root`'s tree that
// have no annotated ancestor below the root (the root itself when none of its descendants is
// annotated). Throws std::invalid_argument for a path that names no module, a module whose
// forward is not annotated, one nested in another, a path given twice, or a tree with no
// annotated module.
std::vector<PlannerTarget> planner_targets(torch::nn::Module& root,
                                           const std::vector<std::string>& paths);

// The module at `path` below `root` ("" is the root), or null.
std::shared_ptr<torch::nn::Module> find_module(torch::nn::Module& root, const std::string& path);

}  // namespace recompose::detail
