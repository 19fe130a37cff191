// The id of the autograd graph task running on this thread (a backward call), or -1 outside of
// one. Implemented in engine_adapter.cpp (LibTorch's autograd engine internals).
#pragma once

#include <cstdint>

namespace recompose::detail {

int64_t current_graph_task_id();

}  // namespace recompose::detail
