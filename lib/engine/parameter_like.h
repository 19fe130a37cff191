// Parameters (and views of them, such as the transposed weight a linear layer saves) are held by
// the model anyway: they are no activations, for what a SavedTensorMeter counts and for what an
// offload reports it could not move.
#pragma once

#include <ATen/core/Tensor.h>

namespace recompose::detail {

inline bool is_parameter_like(const at::Tensor& t) {
  const at::Tensor base = t.is_view() ? at::Tensor(t._base()) : t;
  return base.is_leaf() && base.requires_grad();
}

}  // namespace recompose::detail
