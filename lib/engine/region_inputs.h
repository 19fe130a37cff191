// Rule 2 of NOTE [ Nestable Checkpoint ]: the inputs of a region are saved for backward like any
// saved tensor, so that an enclosing region treats them as tensors saved to it (and recomputes
// them when the inner region needs its inputs back). PyTorch saves them through a no-op autograd
// Function; recompose makes the same SavedVariables directly (the same hooks, version checks
// and lifetimes), without the node, its dummy input and its empty output.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace recompose::detail {

// The saved inputs of one region invocation. Opaque: implemented in region_inputs_adapter.cpp.
struct RegionInputs;
struct RegionInputsDeleter {
  void operator()(RegionInputs* inputs) const;
};
using SavedRegionInputs = std::unique_ptr<RegionInputs, RegionInputsDeleter>;

// Saves `inputs` (undefined tensors allowed) through this thread's saved-tensor hooks, as
// autograd saves a node's inputs.
SavedRegionInputs save_region_inputs(const std::vector<at::Tensor>& inputs);

// Unpacks the inputs saved by save_region_inputs (may recompute an enclosing region). Throws
// if one was modified in place since, as autograd does for any saved tensor.
std::vector<at::Tensor> unpack_region_inputs(const RegionInputs& inputs);

}  // namespace recompose::detail
