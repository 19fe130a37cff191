// SavedTensorReplay: a region's contexts may also rebuild the region's saved tensors without
// running its forward again, from what they recorded while it ran (selective checkpointing's
// replay, docs/architecture.md "Selective replay"). The frame asks them first and recomputes
// the region as usual when they cannot.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace recompose::detail {

class SavedTensorReplay {
 public:
  virtual ~SavedTensorReplay() = default;

  // Forward, before the body runs: the region's inputs (undefined tensors allowed).
  virtual void region_inputs(const std::vector<at::Tensor>& inputs) = 0;

  // Forward: autograd saved `tensor` in the region; `index` is its Holder.
  virtual void saved(std::size_t index, const at::Tensor& tensor) = 0;

  // Backward: sets out[i] to the value of saved tensor i for every i with needed[i], from the
  // region's unpacked `inputs`, and returns true. Returns false, having changed nothing the
  // recomputation reads, when this invocation cannot be replayed (the frame then runs the
  // region's forward again). `rng_preserved`: the region restores RNG state for recomputations
  // (preserve_rng_state). Throws the errors a recomputation would throw for the same misuse.
  virtual bool replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
                      const std::vector<bool>& needed, std::vector<at::Tensor>& out) = 0;

  // Backward: the frame recomputes this invocation without asking replay(), for `why` (a region
  // nested in it, debug mode...): counted with the replay's own fallbacks.
  virtual void not_replayed(const char* why) = 0;
};

}  // namespace recompose::detail
