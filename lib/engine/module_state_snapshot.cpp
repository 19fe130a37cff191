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

std::recursive_mutex& module_state_lock();

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

// Points `impl` at `storage` with this geometry, directly: no op runs, so no version counter
// moves and no dispatch mode sees it (Tensor::set_ would bump the live counter).
// A buffer made from a `.data()` tensor forbids metadata changes: allowed for the swap alone.
void point_at(c10::TensorImpl* impl, at::Storage storage, c10::IntArrayRef sizes,
              c10::IntArrayRef strides, int64_t storage_offset) {
  const bool allowed = impl->allow_tensor_metadata_change();
  impl->set_allow_tensor_metadata_change(true);
  impl->set_storage_keep_dtype(std::move(storage));
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  impl->set_allow_tensor_metadata_change(allowed);
}

}  // namespace

ModuleStateSnapshot::ModuleStateSnapshot(
    const std::vector<std::shared_ptr<torch::nn::Module>>& roots,
    const std::shared_ptr<torch::nn::Module>& also) {
  // The guards are for the buffer copies: taken at the first buffer (most modules have none).
  std::optional<InternalOpsGuard> internal;
  std::optional<at::NoGradGuard> no_grad;
  // A module (or buffer) reached twice, through two roots or two parents, is recorded once.
  // Regions are usually small trees: a linear search costs less than a hash set's allocations.
  SeenOnce<const torch::nn::Module*> seen_modules;
  SeenOnce<const c10::TensorImpl*> seen_buffers;
  std::unique_lock<std::recursive_mutex> lock(module_state_lock(), std::defer_lock);
  auto record = [&](const std::shared_ptr<torch::nn::Module>& module) {
    if (!seen_modules.insert(module.get())) return;
    modes_.emplace_back(module, module->is_training());
    for (const auto& buffer : module->buffers(/*recurse=*/false)) {
      if (!buffer.defined() || !seen_buffers.insert(buffer.unsafeGetTensorImpl())) continue;
      if (!internal) {
        internal.emplace();
        no_grad.emplace();
        lock.lock();  // another thread's recomputation may have this buffer pointed elsewhere
      }
      // Version 0 for inference tensors, which have no counter (and are never saved for backward).
      const c10::VariableVersion& counter = buffer.unsafeGetTensorImpl()->version_counter();
      buffers_.push_back(
          BufferEntry{buffer, buffer.clone(), counter.enabled() ? counter.current_version() : 0});
    }
  };
  for (const auto& root : roots) {
    if (root) for_each_module(root, record);
  }
  if (also) for_each_module(also, record);
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
  // The usual case without buffers: the modes are the forward's; nothing to do.
  if (modes_.empty() && snapshot->buffers_.empty()) return;
  lock_ = std::unique_lock<std::recursive_mutex>(module_state_lock());
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  c10::InferenceMode not_inference(false);
  if (!modes_.empty()) set_modes(snapshot->modes_);
  buffers_.reserve(snapshot->buffers_.size());
  try {
    put_entry_values(*snapshot);
  } catch (...) {
    restore();  // what was put in place so far
    throw;
  }
}

std::recursive_mutex& module_state_lock() {
  static std::recursive_mutex lock;
  return lock;
}

void ModuleStateSnapshot::RecomputeScope::put_entry_values(const ModuleStateSnapshot& snapshot) {
  for (const auto& entry : snapshot.buffers_) {
    c10::TensorImpl* impl = entry.buffer.unsafeGetTensorImpl();
    buffers_.push_back(LiveBuffer{entry.buffer, impl->storage(),
                                  c10::SmallVector<int64_t, 4>(impl->sizes()),
                                  c10::SmallVector<int64_t, 4>(impl->strides()),
                                  impl->storage_offset(), impl->version_counter()});
    // A copy each time: with retain_graph the region may be recomputed again. Its own counter
    // starts where the forward's started, and whatever the recomputation writes moves only it.
    const at::Tensor value = entry.at_entry.clone(at::MemoryFormat::Preserve);
    point_at(impl, value.storage(), value.sizes(), value.strides(), value.storage_offset());
    if (!impl->is_inference()) impl->set_version_counter(c10::VariableVersion(entry.version));
  }
}

ModuleStateSnapshot::RecomputeScope::~RecomputeScope() { restore(); }

void ModuleStateSnapshot::RecomputeScope::restore() {
  for (auto& b : buffers_) {
    c10::TensorImpl* impl = b.buffer.unsafeGetTensorImpl();
    point_at(impl, std::move(b.storage), b.sizes, b.strides, b.storage_offset);
    if (!impl->is_inference()) impl->set_version_counter(std::move(b.version));
  }
  buffers_.clear();
  if (modes_.empty()) return;
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  c10::InferenceMode not_inference(false);
  set_modes(modes_);
  modes_.clear();
}

}  // namespace recompose::detail
