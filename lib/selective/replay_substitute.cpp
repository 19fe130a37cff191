#include "replay_substitute.h"

#include "op_names.h"
#include "op_traits.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/amax.h>

#include <c10/core/ScalarType.h>
#include <c10/core/WrapDimMinimal.h>

namespace recompose::detail {
namespace {

// What _safe_softmax runs as (OpTraits::cheaper_replay is set only where it is registered).
const std::optional<c10::OperatorHandle>& plain_softmax() {
  static const std::optional<c10::OperatorHandle> op = find_overload("aten::softmax.int");
  return op;
}

// No row of the softmax result `out` along `dim` is zero everywhere. A row softmax computed
// holds at least 1 / its length (at its largest input); a fully masked row is all zeros; a row
// with a NaN fails the comparison too (it is not replaced then, nor by the where).
bool no_row_all_zero(const at::Tensor& out, int64_t dim) {
  if (out.device().type() != c10::DeviceType::CPU || out.numel() == 0 ||
      !at::isFloatingType(out.scalar_type()))
    return false;
  return at::amax(out, {dim}).gt(0).all().item<bool>();
}

}  // namespace

std::optional<c10::OperatorHandle> cheaper_replay_op(const c10::OperatorHandle& op,
                                                     c10::ArrayRef<c10::IValue> constants,
                                                     const at::Tensor& result) {
  if (!OpTraits::of(op).cheaper_replay) return std::nullopt;
  // _safe_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
  if (constants.size() != 3 || !constants[1].isInt() || !result.defined() || result.dim() == 0)
    return std::nullopt;
  // softmax returns a contiguous tensor: the substitute is laid out as the forward's result only
  // then (decided here, so that the replay never meets another layout; Note [ A replayed op that
  // returns another layout ], replay_executor.cpp).
  if (!result.is_contiguous()) return std::nullopt;
  const int64_t dim = c10::maybe_wrap_dim(constants[1].toInt(), result.dim());
  if (!no_row_all_zero(result, dim)) return std::nullopt;
  return plain_softmax();
}

}  // namespace recompose::detail
