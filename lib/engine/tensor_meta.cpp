#include "engine/tensor_meta.h"

#include <sstream>

namespace recompose::detail {

std::string TensorMeta::str() const {
  std::ostringstream out;
  out << "{shape: [";
  for (std::size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << "], dtype: " << c10::toString(dtype) << ", device: " << device << "}";
  return out.str();
}

}  // namespace recompose::detail
