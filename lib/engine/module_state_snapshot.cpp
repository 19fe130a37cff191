#include "engine/module_state_snapshot.h"

#include "engine/internal_ops.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/module.h>

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

namespace recompose::detail {
namespace {

// Sets each module's own mode, parents first: train(bool) recurses, so a child's mode is set
// after its parent's.
template <class Modes>
void set_modes(const Modes& modes) {
  for (const auto& [module, training] : modes) {
    if (module->is_training() != training) module->train(training);
  }
  // A parent's train() may have overwritten a child set before it when a module appears
  // under two parents; a second pass settles it.
  for (const auto& [module, training] : modes) {
    if (module->is_training() != training) module->train(training);
  }
}

// A set of pointers that searches linearly while small and hashes once it grows.
template <class T>
class SeenOnce {
 public:
  // True if `p` was not in the set (and is now).
  bool insert(T p) {
    if (!hashed_.empty()) return hashed_.insert(p).second;
    if (std::find(small_.begin(), small_.end(), p) != small_.end()) return false;
    small_.push_back(p);
    if (small_.size() > kLinear) hashed_.insert(small_.begin(), small_.end());
    return true;
  }

 private:
  static constexpr std::size_t kLinear = 32;
  c10::SmallVector<T, 8> small_;
  std::unordered_set<T> hashed_;
};

// Calls f on `module` and its descendants, parents first (the order of Module::modules(), which
// also builds every qualified name: a string per module and region).
template <class F>
void for_each_module(const std::shared_ptr<torch::nn::Module>& module, const F& f) {
  f(module);
  for (const auto& child : module->children()) for_each_module(child, f);
}

}  // namespace

ModuleStateSnapshot::ModuleStateSnapshot(const std::vector<std::shared_ptr<torch::nn::Module>>& roots,
                                         const std::shared_ptr<torch::nn::Module>& also) {
  // The guards are for the buffer copies: taken at the first buffer (most modules have none).
  std::optional<InternalOpsGuard> internal;
  std::optional<at::NoGradGuard> no_grad;
  // A module (or buffer) reached twice, through two roots or two parents, is recorded once.
  // Regions are usually small trees: a linear search costs less than a hash set's allocations.
  SeenOnce<const torch::nn::Module*> seen_modules;
  SeenOnce<const c10::TensorImpl*> seen_buffers;
  auto record = [&](const std::shared_ptr<torch::nn::Module>& module) {
    if (!seen_modules.insert(module.get())) return;
    modes_.emplace_back(module, module->is_training());
    for (const auto& buffer : module->buffers(/*recurse=*/false)) {
      if (!buffer.defined() || !seen_buffers.insert(buffer.unsafeGetTensorImpl())) continue;
      if (!internal) {
        internal.emplace();
        no_grad.emplace();
      }
      buffers_.push_back(BufferEntry{buffer, buffer.clone(), buffer._version()});
    }
  };
  for (const auto& root : roots) {
    if (root) for_each_module(root, record);
  }
  if (also) for_each_module(also, record);
}

void ModuleStateSnapshot::forward_done() {
  if (buffers_.empty()) return;
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  // A moved version counter means the forward wrote the buffer. Some kernels write their inputs
  // without moving it (BatchNorm's running statistics): floating-point buffers that kept their
  // version are compared by value (on a device that waits for the forward's kernels).
  std::erase_if(buffers_, [](const BufferEntry& e) {
    if (e.buffer._version() != e.version) return false;
    if (!at::isFloatingType(e.buffer.scalar_type()) && !at::isComplexType(e.buffer.scalar_type())) return true;
    return e.buffer.sizes() == e.at_entry.sizes() && at::equal(e.buffer, e.at_entry);
  });
}

ModuleStateSnapshot::RecomputeScope::RecomputeScope(const ModuleStateSnapshot* snapshot) {
  if (!snapshot || snapshot->empty()) return;
  for (const auto& [module, training] : snapshot->modes_) {
    if (module->is_training() != training) {
      // Record every mode, so that restoring (which recurses) puts each one back.
      for (const auto& [m, _] : snapshot->modes_) modes_.emplace_back(m, m->is_training());
      break;
    }
  }
  // The usual case: the modes are the forward's and no buffer was written; nothing to do.
  if (modes_.empty() && snapshot->buffers_.empty()) return;
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  c10::InferenceMode not_inference(false);
  if (!modes_.empty()) set_modes(snapshot->modes_);
  buffers_.reserve(snapshot->buffers_.size());
  for (const auto& entry : snapshot->buffers_) {
    at::Tensor buffer = entry.buffer;
    // A copy each time: with retain_graph the region may be recomputed again.
    buffers_.push_back(LiveBuffer{buffer, buffer.detach()});
    buffer.set_(entry.at_entry.clone());
  }
}

ModuleStateSnapshot::RecomputeScope::~RecomputeScope() {
  if (buffers_.empty() && modes_.empty()) return;
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  c10::InferenceMode not_inference(false);
  for (auto& b : buffers_) b.buffer.set_(b.live);
  set_modes(modes_);
}

}  // namespace recompose::detail
