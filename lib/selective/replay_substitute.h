// Ops a selective replay may run as a cheaper op that gives, for the values the forward saw, the
// same bits: decided in the forward, where those values are at hand.
//
// aten::_safe_softmax (sdpa's math path) is softmax with the rows whose inputs are all -inf set
// to zero: softmax plus an eq, an all-reduction and a where over the whole input, about six
// times the cost of the softmax on CPU. When no row of the forward's result is zero everywhere,
// no row was fully masked, the where picked softmax's result everywhere, and aten::softmax.int
// (the call _safe_softmax makes, with the same arguments) gives the same bits.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <optional>

namespace recompose::detail {

// The op the replay may run instead of `op` (one whose OpTraits::cheaper_replay is set; nullopt
// for any other), taking its arguments unchanged, given the forward's
// call: `constants` holds each argument's value where it is no tensor (None where it is one),
// `result` its first output. nullopt to run `op` itself. Only host results are checked (a check
// of a device tensor would make the forward wait for the device).
std::optional<c10::OperatorHandle> cheaper_replay_op(const c10::OperatorHandle& op,
                                                     c10::ArrayRef<c10::IValue> constants,
                                                     const at::Tensor& result);

}  // namespace recompose::detail
