// Holder: what autograd's SavedVariable keeps in place of a tensor saved in a checkpointed
// region's forward. A recomputation fills it, per graph task; unpacking hands the value out once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace recompose::detail {

struct Holder {
  struct Slot {
    int64_t graph_task;
    at::Tensor value;
    bool consumed = false;
  };
  // Almost always one backward at a time: the first slot lives inline (no allocation per tensor).
  c10::SmallVector<Slot, 1> slots;

  Slot* find(int64_t graph_task) {
    for (auto& s : slots) {
      if (s.graph_task == graph_task) return &s;
    }
    return nullptr;
  }
  void put(int64_t graph_task, at::Tensor value) {
    if (Slot* s = find(graph_task)) {
      *s = Slot{graph_task, std::move(value), false};
    } else {
      slots.push_back(Slot{graph_task, std::move(value), false});
    }
  }
};

}  // namespace recompose::detail
