// The device a model lives on, as the planner's tools run it: its first parameter's (CPU for a
// model without parameters). The profile and the trials synchronise and measure memory there.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

namespace recompose::detail {

inline c10::Device device_of(torch::nn::Module& model) {
  for (const auto& p : model.parameters()) return p.device();
  return c10::kCPU;
}

}  // namespace recompose::detail
