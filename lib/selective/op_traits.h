// OpTraits: everything selective checkpointing (and the planner's profiler) asks of an operator
// that its schema, tags and name decide, computed once per operator and shared by every thread.
// Facts that depend on a call's arguments stay per call (autocast_cacheable_cast below; the
// carried write's checks in forward_interceptor.cpp; the cheaper replay's check of the forward's
// result in replay_substitute.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace recompose::detail {

struct OpTraits {
  // aten::detach and the metadata ops (prim::device, aten::size, aten::stride, aten::dim, ...;
  // every overload): upstream's SAC_IGNORED_OPS. The engine and autograd issue a different number
  // of them in the forward and in the recomputation, so they are neither shown to the policy nor
  // counted.
  bool ignored = false;
  // An output aliases an input (views, in-place and out= ops): such outputs are never shown to
  // the policy and always recomputed (see recompose/selective_checkpoint.h).
  bool returns_alias = false;
  // Outputs alias an input and none is written (aten::view, aten::t, ...): a save list may name
  // it, as in PyTorch.
  bool view = false;
  // An output aliases an input without being written (the planner's OpProfile::view).
  bool returns_unwritten_alias = false;
  // The arguments the schema declares written (alias sets with `!`), in order: in place, out=, or
  // beside new outputs (rrelu_with_noise's noise). writes_argument: there is one.
  c10::SmallVector<uint32_t, 2> written_arguments;
  bool writes_argument = false;
  bool writes(size_t argument) const {
    for (const uint32_t w : written_arguments) {
      if (w == argument) return true;
    }
    return false;
  }
  // Writes into arguments its schema does not declare (native_batch_norm and the other batch-norm
  // kernels update the running statistics in place, yet their schemas say nothing): a replay must
  // not run them again.
  bool writes_undeclared = false;
  // Draws random numbers: tagged nondeterministic_seeded, or taking a Generator.
  bool random = false;
  // aten::bernoulli_ (either overload): writes only 0 and 1 into self, kept as bits (DrawMask).
  bool draw = false;
  // aten::native_dropout (dropout on CUDA, and on CPU when called directly): in training its draw
  // is kept (DropoutDraw) and the replay rebuilds both outputs from it.
  bool native_dropout = false;
  // aten::_to_copy: a call may be one of autocast's cached parameter casts (per call:
  // autocast_cacheable_cast).
  bool to_copy = false;
  // aten::_safe_softmax: a replay may run it as a cheaper op (replay_substitute.h decides per
  // call, from the forward's result).
  bool cheaper_replay = false;
  // The argument an in-place op writes into, when it writes values into exactly one tensor
  // argument, self, and returns only that argument (add_, mul_, relu_, copy_...); -1 otherwise.
  // Not out= ops (they may resize their output), nor ops that change self's sizes, strides or
  // storage rather than its values (t_, unsqueeze_, resize_, set_...): a recomputation that
  // skips those would go on with the wrong layout.
  int32_t inplace_argument = -1;
  // A write into a kept output that the output's cache entry may carry: in place into one
  // argument (inplace_argument), and not random (a recomputation must draw as the forward drew).
  bool carriable = false;
  // std::hash of the op's name ("aten::add", every overload alike): per-op name matching and
  // hashing (save lists, the policy tally) without hashing the name at every call.
  size_t name_hash = 0;

  // The traits of `op` (which has a schema): computed at its first call, then a lookup without
  // locks. Thread-safe. An operator whose schema is deregistered is forgotten (a later operator
  // at the same handle gets its own traits).
  static const OpTraits& of(const c10::OperatorHandle& op);
};

// True for aten::_to_copy of a float32 leaf tensor that requires grad (a parameter) to bfloat16 or
// float16, its arguments on top of `stack`: the casts autocast caches. Whether one runs depends on
// the state of autocast's cache (a parameter cast before the region in the same autocast scope
// is not cast again in the forward, but is in the recomputation), so selective checkpointing
// neither shows them to the policy nor counts them: they always run, and forward and
// recomputation keep matching call for call.
bool autocast_cacheable_cast(const OpTraits& traits, const c10::OperatorHandle& op,
                             const torch::jit::Stack& stack);

}  // namespace recompose::detail
