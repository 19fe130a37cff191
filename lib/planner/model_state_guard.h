// What profiling must leave as it found it. profile_memory runs the user's training step twice;
// the step moves BatchNorm's running statistics, accumulates into .grad, may step an optimizer,
// switch train/eval and draw random numbers. The guard records all of that on entry and puts it
// back, between the runs and on every exit (exceptions included):
//   - parameters and buffers: their values, bitwise, written back into the same tensors (users
//     hold them); a tensor is written only if the step changed it (its version counter moved or
//     its value differs), so tensors the step left alone keep their version counters;
//   - each parameter's .grad: undefined stays undefined; a defined one is the same tensor again,
//     with its values;
//   - the train/eval mode of the model and of every submodule;
//   - the CPU generator and, for a model on a device, that device's default generator.
// Not covered: state outside the model, such as an optimizer's own state (momentum, Adam's
// moments) when the step steps one, or the .grad of tensors that are no parameters.
// The guard holds one copy of the parameters, buffers and gradients in host memory, not on their
// device: the profiled step must find the device as training will, or the allocator's peak (the
// profile's resident_bytes, a peak budget's base) would count a second copy of the model.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::detail {

class ModelStateGuard {
 public:
  // Records `model`'s state, and the generators of the CPU and of `device`.
  ModelStateGuard(torch::nn::Module& model, const c10::Device& device);
  // While an exception unwinds the stack: restores (errors swallowed). Otherwise the owner has
  // called restore() itself, where errors can go through.
  ~ModelStateGuard();
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;

  // Puts everything back as it was on entry; may be called any number of times.
  void restore();

 private:
  struct Value {  // a tensor of the model, its value on entry, its version when last restored
    at::Tensor tensor;
    at::Tensor saved;                // in host memory
    c10::Device device = c10::kCPU;  // the tensor's on entry
    int64_t version = 0;
  };
  static Value value_of(const at::Tensor& t);
  struct Grad {
    at::Tensor param;
    Value grad;  // the .grad tensor on entry (undefined if none)
  };
  struct GeneratorState {
    at::Generator generator;
    at::Tensor state;
  };
  static void restore_value(Value& v);

  int uncaught_on_entry_;
  torch::nn::Module* root_;
  bool root_training_;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;  // pre-order
  std::vector<Value> values_;  // parameters and buffers, each once
  std::vector<Grad> grads_;
  std::vector<GeneratorState> generators_;
};

}  // namespace recompose::detail
