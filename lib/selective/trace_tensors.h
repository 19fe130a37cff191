// Small tensor helpers shared by the forward trace (forward_trace.cpp), the replay's execution
// (replay_executor.cpp) and the cache entries (cache_entry.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/TensorImpl.h>

#include <cstddef>
#include <cstdint>

namespace recompose::detail {

// A new TensorImpl on the same storage with the same version counter: in-place writes through
// either are visible to the version check (what upstream's _detach_helper gets by detaching
// with ADInplaceOrView enabled). No dispatch: cheap, and no interceptor sees it.
inline at::Tensor alias_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(),
                                                  /*allow_tensor_metadata_change=*/false));
}

// The tensor's version counter; 0 for inference tensors, which have none.
inline uint32_t version_or_zero(const at::Tensor& t) {
  const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
  return vc.enabled() ? vc.current_version() : 0;
}

// Calls f(k, tensor) for the tensors among the top `n` values of `stack`, numbered in order
// (lists flattened); the same numbering in the forward and in the replay.
template <class F>
void for_each_output(const torch::jit::Stack& stack, std::size_t n, F&& f) {
  uint32_t k = 0;
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      f(k++, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) f(k++, t);
    }
  }
}

}  // namespace recompose::detail
