// Which backward a saved tensor is unpacked for: its graph task, or the GraphExecGroup that
// backward call was made in (recompose/graph_exec_group.h). See Note [ Recompute key ].
#pragma once

#include <cstdint>

namespace recompose::detail {

// The id of the autograd graph task running on this thread (a backward call), or -1 outside of
// one. Implemented in engine_adapter.cpp (LibTorch's autograd engine internals).
int64_t current_graph_task_id();

// Called by the engine adapter as a graph task starts, on the thread that started it: a backward
// call made under a GraphExecGroup (or from inside a graph task of one) joins that group.
void note_graph_task_started(int64_t graph_task_id);

// The key under which a recomputation for the backward running on this thread is kept: its
// group's key when it belongs to a GraphExecGroup, else its graph task id; a fresh key outside
// of any backward (an unpack by hand recomputes afresh). Implemented in graph_exec_group.cpp.
int64_t current_recompute_key();

// True when the backward running on this thread belongs to a GraphExecGroup (for messages).
bool in_graph_exec_group();

}  // namespace recompose::detail
