#include "engine/module_state_snapshot.h"

#include "engine/internal_ops.h"
#include "engine/module_state_locks.h"
#include "engine/seen_once.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/module.h>

#include <c10/util/SmallVector.h>

#include <algorithm>

namespace recompose::detail {

namespace {

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
  for (const auto& root : roots) {
    if (root) modes_.add_tree(root);
  }
  if (also) modes_.add_tree(also);
  // A buffer reached twice (a module under two parents, a tensor registered twice) is kept once.
  SeenOnce<const c10::TensorImpl*> seen_buffers;
  modes_.for_each_module([&](torch::nn::Module& module) {
    for (const auto& buffer : module.buffers(/*recurse=*/false)) {
      if (buffer.defined() && seen_buffers.insert(buffer.unsafeGetTensorImpl())) {
        buffers_.push_back(BufferEntry{buffer, at::Tensor(), 0});
      }
    }
  });
  if (buffers_.empty()) return;  // most modules have none: no lock, no copy
  // Another thread's recomputation may have these buffers pointed elsewhere.
  // See Note [ Module state locks ].
  c10::SmallVector<const void*, 16> keys;
  for (const auto& entry : buffers_) keys.push_back(entry.buffer.unsafeGetTensorImpl());
  ModuleStateLocks locks(keys);
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  for (auto& entry : buffers_) {
    // Version 0 for inference tensors, which have no counter (and are never saved for backward).
    const c10::VariableVersion& counter = entry.buffer.unsafeGetTensorImpl()->version_counter();
    entry.version = counter.enabled() ? counter.current_version() : 0;
    entry.at_entry = entry.buffer.clone();
  }
}

ModuleStateSnapshot::RecomputeScope::RecomputeScope(const ModuleStateSnapshot* snapshot) {
  if (!snapshot || snapshot->empty()) return;
  // Every mode is recorded when one differs, so that restoring (which recurses) puts each back.
  if (snapshot->modes_.changed()) modes_ = snapshot->modes_.current();
  // The usual case without buffers: the modes are the forward's; nothing to do.
  if (modes_.empty() && snapshot->buffers_.empty()) return;
  // Held across the recomputation: other threads see these buffers and modes changed meanwhile.
  // See Note [ Module state locks ].
  c10::SmallVector<const void*, 16> keys;
  for (const auto& entry : snapshot->buffers_) keys.push_back(entry.buffer.unsafeGetTensorImpl());
  modes_.for_each_module([&](const torch::nn::Module& module) { keys.push_back(&module); });
  locks_ = ModuleStateLocks(keys);
  InternalOpsGuard internal;
  at::NoGradGuard no_grad;
  c10::InferenceMode not_inference(false);
  if (!modes_.empty()) snapshot->modes_.put_back();
  buffers_.reserve(snapshot->buffers_.size());
  try {
    put_entry_values(*snapshot);
  } catch (...) {
    restore();  // what was put in place so far
    throw;
  }
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
  modes_.put_back();
  modes_ = ModuleModes();
}

}  // namespace recompose::detail
