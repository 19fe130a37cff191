// TensorMeta: what the determinism check compares between a tensor saved in the forward and its
// recomputed counterpart (shape, dtype, device).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/DimVector.h>

#include <cstdint>
#include <string>
#include <vector>

namespace recompose::detail {

struct TensorMeta {
  c10::DimVector sizes;  // inline up to 5 dimensions: no allocation per saved tensor
  at::ScalarType dtype;
  c10::Device device;
  bool operator==(const TensorMeta& o) const {
    return sizes == o.sizes && dtype == o.dtype && device == o.device;
  }
  std::string str() const;
  static TensorMeta of(const at::Tensor& t) {
    return TensorMeta{c10::DimVector(t.sizes()), t.scalar_type(), t.device()};
  }
};

}  // namespace recompose::detail
