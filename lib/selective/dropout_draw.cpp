#include "dropout_draw.h"

#include "cache_entry.h"
#include "replay_plan.h"
#include "trace_tensors.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/native_dropout_backward.h>

namespace recompose::detail {
namespace {

// What native_dropout's kernel on `input`'s device multiplies the kept elements by (Note [
// Dropout's draw kept on every device ]).
double kernel_scale(const at::Tensor& input, double p) {
  const double p1m = 1. - p;
  if (input.is_cuda() && input.scalar_type() != at::kDouble) {
    // accscalar_t is float: scale = 1.0 / (float)p1m, the division in double, rounded to float.
    return static_cast<double>(
        static_cast<float>(1.0 / static_cast<double>(static_cast<float>(p1m))));
  }
  return 1. / p1m;
}

}  // namespace

std::unique_ptr<DropoutDraw> DropoutDraw::capture(const at::Tensor& input, double p,
                                                  const c10::IValue& train,
                                                  const at::Tensor& mask) {
  const bool training = train.isNone() || (train.isBool() && train.toBool());
  if (!training || !(p >= 0 && p < 1) || !input.defined() || input.numel() == 0 ||
      !mask.defined() || mask.scalar_type() != at::kBool || mask.numel() != input.numel())
    return nullptr;
  std::unique_ptr<DropoutDraw> draw(new DropoutDraw());
  draw->scale_ = kernel_scale(input, p);
  if (input.is_cpu()) {
    draw->bits_ = DrawMask::capture(mask);
    if (!draw->bits_) return nullptr;
    return draw;
  }
  if (!input.is_cuda() || !mask.is_cuda() || !mask.has_storage()) return nullptr;
  draw->kept_mask_ = alias_of(mask);
  draw->kept_bytes_ = static_cast<int64_t>(mask.storage().nbytes());
  return draw;
}

void DropoutDraw::hold() {
  if (bits_ || held_) return;  // bits are charged when packed
  charge_ = MeterCharge(kept_mask_);
  count_bytes_kept(kept_bytes_);
  held_ = true;
}

DropoutDraw::~DropoutDraw() {
  if (held_) count_bytes_kept(-kept_bytes_);
}

at::Tensor DropoutDraw::mask(c10::IntArrayRef sizes, c10::IntArrayRef strides) const {
  if (!bits_) return kept_mask_;
  at::Tensor m = at::empty_strided(sizes, strides, at::TensorOptions().dtype(at::kBool));
  if (!bits_->write_into(m))
    replay_invariant_broken("native_dropout's mask is laid out otherwise than its kept bits");
  return m;
}

at::Tensor DropoutDraw::output(const at::Tensor& input, const at::Tensor& mask) const {
  return at::native_dropout_backward(input, mask, scale_);
}

}  // namespace recompose::detail
