#include "swap/saved_version_check.h"

#include <recompose/checkpoint_error.h>

#include <sstream>

namespace recompose::detail {

void SavedVersionCheck::record(const at::Tensor& tensor) {
  version_ = tensor.unsafeGetTensorImpl()->version_counter();
  saved_version_ = version_->current_version();
  sizes_ = tensor.sizes().vec();
  dtype_ = tensor.scalar_type();
}

void SavedVersionCheck::verify(const char* what) const {
  if (!version_) return;
  const uint32_t current = version_->current_version();
  if (current == saved_version_) return;
  std::ostringstream message;
  message
      << "recompose: one of the variables needed for gradient computation has been modified by an "
         "inplace operation: ["
      << dtype_ << " " << c10::IntArrayRef(sizes_) << "] is at version " << current
      << "; expected version " << saved_version_ << " instead (it was saved for backward under "
      << what
      << "). Do not modify a tensor in place after an op saved it for backward (clone it first).";
  throw CheckpointError(message.str());
}

}  // namespace recompose::detail
