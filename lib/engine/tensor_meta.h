// TensorMeta: what the determinism check compares between a tensor saved in the forward and its
// recomputed counterpart (shape, dtype, device).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace recompose::detail {

struct TensorMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;
  bool operator==(const TensorMeta& o) const { return sizes == o.sizes && dtype == o.dtype && device == o.device; }
  std::string str() const;
  static TensorMeta of(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type(), t.device()}; }
};

}  // namespace recompose::detail
