// Which ops selective checkpointing leaves alone, and which it never keeps.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace recompose::detail {

// aten::detach and the metadata ops (prim::device, aten::size, aten::stride, aten::dim, ...):
// upstream's SAC_IGNORED_OPS. The engine and autograd issue a different number of them in the
// forward and in the recomputation, so they are neither shown to the policy nor counted.
bool is_sac_ignored(const c10::OperatorHandle& op);

// True if an output of `op` aliases an input (views, in-place and out= ops): such outputs are
// always recomputed (see recompose/selective_checkpoint.h).
bool returns_alias(const c10::OperatorHandle& op);

}  // namespace recompose::detail
