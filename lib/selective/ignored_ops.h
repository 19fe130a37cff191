// Which ops selective checkpointing leaves alone, and which it never keeps.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace recompose::detail {

// aten::detach and the metadata ops (prim::device, aten::size, aten::stride, aten::dim, ...):
// upstream's SAC_IGNORED_OPS. The engine and autograd issue a different number of them in the
// forward and in the recomputation, so they are neither shown to the policy nor counted.
bool is_sac_ignored(const c10::OperatorHandle& op);

// True for aten::_to_copy of a float32 leaf tensor that requires grad (a parameter) to bfloat16 or
// float16, its arguments on top of `stack`: the casts autocast caches. Whether one runs depends on
// the state of autocast's cache (a parameter cast before the region in the same autocast scope
// is not cast again in the forward, but is in the recomputation), so selective checkpointing
// neither shows them to the policy nor counts them: they always run, and forward and
// recomputation keep matching call for call.
bool is_autocast_cacheable_cast(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// True if an output of `op` aliases an input (views, in-place and out= ops): such outputs are
// always recomputed (see recompose/selective_checkpoint.h).
bool returns_alias(const c10::OperatorHandle& op);

}  // namespace recompose::detail
