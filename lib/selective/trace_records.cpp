// TensorGeometry (trace_records.h): where a tensor the forward used lies in its storage.
#include "trace_records.h"

namespace recompose::detail {

TensorGeometry TensorGeometry::of(const at::Tensor& t) {
  TensorGeometry g;
  g.set(t);
  return g;
}

void TensorGeometry::set(const at::Tensor& t) {
  sizes.assign(t.sizes().begin(), t.sizes().end());
  strides.assign(t.strides().begin(), t.strides().end());
  offset = t.storage_offset();
  dtype = t.scalar_type();
}

bool TensorGeometry::same_shape(const at::Tensor& t) const {
  return t.scalar_type() == dtype && t.sizes() == c10::IntArrayRef(sizes) &&
         t.strides() == c10::IntArrayRef(strides);
}

}  // namespace recompose::detail
