// The version check that LibTorch skips for saved tensors with hooks: a tensor modified in place
// after an op saved it would silently give wrong gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <optional>
#include <vector>

namespace recompose::detail {

class SavedVersionCheck {
 public:
  // Records the version of `tensor` as it is saved (at pack).
  void record(const at::Tensor& tensor);
  // Throws CheckpointError if the tensor was modified in place since record(). `what` says
  // under which recompose feature it was saved (for the message).
  void verify(const char* what) const;

 private:
  std::optional<c10::VariableVersion> version_;  // shared with the saved tensor
  uint32_t saved_version_ = 0;
  std::vector<int64_t> sizes_;  // for the message
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
};

}  // namespace recompose::detail
