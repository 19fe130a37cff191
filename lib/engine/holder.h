// Holder: the frame's slot for one tensor saved in a checkpointed region's forward (autograd's
// SavedVariable keeps only its index, through the region's hooks). A recomputation fills it, per
// graph task; unpacking hands the value out once.
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
  // False once the SavedVariable that stood for it is gone: a recomputation no longer fills it.
  bool alive = true;

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
