// DrawMask: what an in-place Bernoulli draw wrote (dropout on CPU: aten::bernoulli_ into an
// empty float tensor, then div_ and mul), kept as one bit per element so that the selective
// replay writes the forward's draw back instead of drawing it again. On CPU the draw costs more
// than every other op the replay recomputes; the bits cost 1/32 of the float noise they rebuild
// (docs/architecture.md, "Selective replay").
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/meter_charge.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

class DrawMask {
 public:
  // After the draw (of an op whose OpTraits::draw is set): `drawn` is the tensor it wrote into
  // (or native_dropout's bool mask, DropoutDraw). nullptr when it cannot be kept as bits (not a
  // contiguous CPU tensor of a floating dtype or bool, or a value other than exactly +0 or 1):
  // the replay then draws again, from the forward's generator state.
  static std::unique_ptr<DrawMask> capture(const at::Tensor& drawn);

  // Writes the kept draw into `target` (the replay's tensor where the forward drew, laid out
  // alike): bitwise the values the draw wrote. False, having written nothing, if `target` is
  // not such a tensor.
  bool write_into(const at::Tensor& target) const;

  // The bits' bytes (what the region holds for the draw until its rebuild).
  int64_t bytes() const { return static_cast<int64_t>(bits_.size()); }

  DrawMask(const DrawMask&) = delete;
  DrawMask& operator=(const DrawMask&) = delete;
  ~DrawMask();

 private:
  DrawMask() = default;
  at::ScalarType dtype_ = at::kFloat;
  int64_t numel_ = 0;
  std::vector<uint8_t> bits_;  // element i is bit i % 8 of byte i / 8 (memory order)
  MeterCharge charge_;         // the bytes of bits_, as the kept outputs are charged
};

}  // namespace recompose::detail
