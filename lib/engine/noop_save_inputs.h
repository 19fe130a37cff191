// Rule 2 of NOTE [ Nestable Checkpoint ]: the inputs of a region are saved for backward by a
// no-op autograd function, so that an enclosing region treats them as tensors saved to it (and
// recomputes them when the inner region needs its inputs back).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace recompose::detail {

// Saves `inputs` (undefined tensors allowed) as saved variables of a fresh autograd node and
// returns that node's (empty) output. With grad mode off the result has no grad_fn.
at::Tensor save_region_inputs(const std::vector<at::Tensor>& inputs);

// Unpacks the inputs saved by save_region_inputs (may recompute an enclosing region).
std::vector<at::Tensor> unpack_region_inputs(const at::Tensor& input_saver);

}  // namespace recompose::detail
