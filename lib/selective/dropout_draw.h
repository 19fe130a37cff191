// DropoutDraw: the draw of one aten::native_dropout in training (dropout on CUDA; on CPU when
// called directly), kept so that the selective replay makes both of its outputs, the output and
// the bool mask, from its input and the draw instead of drawing again.
//
// Note [ Dropout's draw kept on every device ]
// On CPU, dropout is bernoulli_ into a float tensor, then div_ and mul; its draw is kept as bits
// (DrawMask, OpTraits::draw). On CUDA, dropout is one fused kernel, aten::native_dropout, which
// returns the output and a bool mask; the replay ran it again, drawing again from the forward's
// generator state. Now its draw is kept and the replay runs aten::native_dropout_backward(input,
// mask, scale) instead: the kernel PyTorch uses for dropout's gradient computes what the forward
// kernel did, bit for bit, given the same scale:
//  - CPU: native_dropout_cpu returns input.mul(mask).mul_(1 / (1 - p)); its backward computes
//    grad * mask * scale, the same two products in the same dtypes.
//  - CUDA (Dropout.cu): the fused kernel returns src * m * scale, m in {0, 1} as float and scale =
//    1.0 / (accscalar_t)(1 - p) in accscalar_t (float for float, half and bfloat16; double for
//    double); masked_scale, the backward's kernel, returns (float)m * src * (accscalar_t)scale:
//    m * src is exact either way, so passing the forward's accscalar_t scale gives its bits.
// How the draw is held differs by device. On CPU as bits (DrawMask over the bool mask: 1/8 byte
// an element), packed and unpacked on the host. On CUDA as the forward's own bool mask (one byte
// an element, what plain training holds for dropout's backward anyway): packing it into bits would
// take kernels in the forward that cost about what the replay saves (the draw is one memory-bound
// kernel, its replay from the mask another of the same traffic), so the mask is held as it is. For
// the same reason a mask is worth its bytes only where the replay needs the mask alone (a residual
// dropout whose output no saved tensor reads: the replay runs nothing for it); where the replay
// reads the output, making it from the mask moves the bytes the fused draw moved, so at the end of
// the forward such masks are released (ForwardTrace::settle_kept_for_replay) and the replay runs
// native_dropout again from the forward's generator state, as before. The masks kept count in the
// region's budget for what it keeps for the replay (parameter_casts.h). The generators: the replay
// does not draw, and leaves them where backward found them (as for a kept DrawMask); every random
// op the replay does run rewinds to where the forward found its own generators, so it draws what it
// drew. Other devices: not kept (their kernels are not known to compute the same); the replay runs
// native_dropout again, as before.
#pragma once

#include "draw_mask.h"
#include "engine/meter_charge.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>

namespace recompose::detail {

class DropoutDraw {
 public:
  // After native_dropout(input, p, train) ran, with `mask` its second output. nullptr when the
  // draw is not kept: not in training (train false: nothing drawn), p outside [0, 1) (p == 1
  // draws nothing on CUDA), an empty input, a device other than CPU and CUDA, or a mask the bits
  // cannot hold (DrawMask::capture).
  static std::unique_ptr<DropoutDraw> capture(const at::Tensor& input, double p,
                                              const c10::IValue& train, const at::Tensor& mask);

  // The mask as the forward returned it, laid out with `sizes` and `strides` (its base's).
  at::Tensor mask(c10::IntArrayRef sizes, c10::IntArrayRef strides) const;
  // The output, from the forward's input and the mask: bitwise the forward's (Note above).
  at::Tensor output(const at::Tensor& input, const at::Tensor& mask) const;

  // What the region holds for the draw until its rebuild.
  int64_t bytes() const { return bits_ ? bits_->bytes() : kept_bytes_; }
  // Held on the device (the bool mask), not as host bits.
  bool on_device() const { return !bits_; }
  // Kept past the forward (ForwardTrace::settle_kept_for_replay): the mask is charged to the
  // thread's meters and counted in the bytes kept (bits are, when packed).
  void hold();

  DropoutDraw(const DropoutDraw&) = delete;
  DropoutDraw& operator=(const DropoutDraw&) = delete;
  ~DropoutDraw();

 private:
  DropoutDraw() = default;
  std::unique_ptr<DrawMask> bits_;  // CPU
  at::Tensor kept_mask_;            // CUDA: the forward's mask
  int64_t kept_bytes_ = 0;
  MeterCharge charge_;  // kept_mask_'s bytes, as a kept output is charged (hold())
  bool held_ = false;
  double scale_ = 1;  // what the forward's kernel multiplied by (Note above)
};

}  // namespace recompose::detail
