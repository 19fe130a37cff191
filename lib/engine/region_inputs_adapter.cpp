// Adapter: torch::autograd::SavedVariable, made directly for a region's inputs (see
// region_inputs.h). Its constructor asks the default engine for saved-tensor hooks, exactly as
// when a node saves a tensor; unpack() checks the version counter when no hook took the tensor.
#include "engine/region_inputs.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/region_inputs_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check torch/csrc/autograd/saved_variable.h (the constructor that \
asks the engine for saved-tensor hooks, unpack()), then extend torch_version_guard.h"
#endif

#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/saved_variable.h>

namespace recompose::detail {

struct RegionInputs {
  c10::SmallVector<torch::autograd::SavedVariable, 2>
      saved;  // most regions take one or two tensors
};

void RegionInputsDeleter::operator()(RegionInputs* inputs) const { delete inputs; }

SavedRegionInputs save_region_inputs(const std::vector<at::Tensor>& inputs) {
  SavedRegionInputs out(new RegionInputs());
  out->saved.reserve(inputs.size());
  // is_output = false: an input of the saver, as for the no-op Function's saved inputs.
  for (const auto& t : inputs) out->saved.emplace_back(t, /*is_output=*/false);
  return out;
}

std::vector<at::Tensor> unpack_region_inputs(const RegionInputs& inputs) {
  std::vector<at::Tensor> out;
  out.reserve(inputs.saved.size());
  for (const auto& s : inputs.saved) out.push_back(s.unpack());
  return out;
}

}  // namespace recompose::detail
