// Holder: what autograd's SavedVariable keeps in place of a tensor saved in a checkpointed
// region's forward. A recomputation fills it, per graph task; unpacking hands the value out once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>

namespace recompose::detail {

struct Holder {
  struct Slot {
    at::Tensor value;
    bool consumed = false;
  };
  std::unordered_map<int64_t, Slot> by_graph_task;
};

}  // namespace recompose::detail
