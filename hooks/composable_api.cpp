// The non-template part of ComposableApi: the annotated-forward check and its message, and the
// hooks an API registers.
#include <recompose/hooks/composable_api.h>

#include <torch/nn/module.h>

#include <c10/util/Type.h>

#include <stdexcept>
#include <unordered_set>
#include <vector>

namespace recompose::hooks {

std::string module_type_name(const torch::nn::Module& module) {
  return c10::demangle(typeid(module).name());
}

bool is_libtorch_module(const torch::nn::Module& module) {
  return module_type_name(module).starts_with("torch::nn::");
}

namespace detail {

std::string how_to_annotate(const torch::nn::Module& module, const BuiltinModuleAdvice& advice) {
  const std::string type = module_type_name(module);
  if (is_libtorch_module(module)) {
    // Pointing at LibTorch's own source would send the user to a file they cannot change.
    std::string text =
        type + " is one of LibTorch's own modules, whose forward cannot be annotated. ";
    if (advice) return text + advice(module);
    return text +
           "Call it from the forward of a module of your own that carries RECOMPOSE_FORWARD.";
  }
  return "Add RECOMPOSE_FORWARD(<every parameter, in order>); as the first statement of " + type +
         "::forward (see recompose/hooks/forward_annotation.h)";
}

void throw_not_applied(const torch::nn::Module& module, std::string_view function,
                       std::string_view api_function) {
  // One prefix for every error of recompose: "recompose: offload_stats: ...".
  if (function.starts_with("recompose::"))
    function.remove_prefix(std::string_view("recompose::").size());
  throw CheckpointError("recompose: " + std::string(function) + ": " + std::string(api_function) +
                        " is not applied to module " + module.name() + "; call " +
                        std::string(api_function) + " on it first");
}

}  // namespace detail

void require_annotated_forward(const torch::nn::Module& module, std::string_view api_function,
                               const BuiltinModuleAdvice& advice) {
  if (has_annotated_forward(module)) return;
  throw std::invalid_argument("recompose: " + std::string(api_function) + " cannot be applied to " +
                              module_type_name(module) + ": its forward() is not annotated. " +
                              detail::how_to_annotate(module, advice));
}

int64_t apply_to_matching(torch::nn::Module& root, std::string_view api_function,
                          const std::string& type_name,
                          const std::function<bool(const torch::nn::Module&)>& match,
                          const std::function<void(torch::nn::Module&)>& apply,
                          const std::function<void(torch::nn::Module&)>& undo) {
  // modules(include_self=false): the root needs no shared_ptr of its own to be walked.
  std::vector<torch::nn::Module*> candidates{&root};
  for (const auto& m : root.modules(/*include_self=*/false)) candidates.push_back(m.get());
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<torch::nn::Module*> done;
  try {
    for (torch::nn::Module* m : candidates) {
      if (!seen.insert(m).second || !match(*m)) continue;
      apply(*m);
      done.push_back(m);
    }
  } catch (...) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) undo(**it);
    throw;
  }
  if (done.empty()) {
    throw std::invalid_argument("recompose: " + std::string(api_function) + ": no module of type " +
                                type_name + " in " + root.name() + "'s tree; nothing was applied");
  }
  return static_cast<int64_t>(done.size());
}

void ApiHooks::pre(ForwardHook hook, HookOptions options) {
  handles_.push_back(
      register_forward_pre_hook(*module_, std::move(hook), std::move(options.owner(owner_))));
}

void ApiHooks::post(ForwardHook hook, HookOptions options) {
  handles_.push_back(
      register_forward_hook(*module_, std::move(hook), std::move(options.owner(owner_))));
}

void ApiHooks::remove_all() {
  for (auto& h : handles_) h.remove();
  handles_.clear();
}

}  // namespace recompose::hooks
