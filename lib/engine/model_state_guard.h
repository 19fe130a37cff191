// A model's state, recorded and put back: what a tool that runs the user's code must leave as it
// found it. profile_memory (lib/planner) runs the user's training step twice, inspect_policy
// (lib/selective) a forward twice; a step moves BatchNorm's running statistics, accumulates into
// .grad, may step an optimizer, switch train/eval and draw random numbers. The guard records the
// parts asked for on entry and puts them back when restore() is called, and on every exit by an
// exception:
//   - parameters and buffers: their values, bitwise, written back into the same tensors (users
//     hold them) where the run changed them (their version counter moved, or their value
//     differs), without moving their version counters (what autograd saved before the run
//     checks them);
//   - each parameter's .grad: undefined stays undefined; a defined one is the same tensor again,
//     with its values;
//   - the train/eval mode of each root and of every submodule;
//   - the CPU generator and the default generators of the CUDA devices the roots' tensors live
//     on (and of the device named, if any).
// Not covered: state outside the modules, such as an optimizer's own state (momentum, Adam's
// moments) when the step steps one, or the .grad of tensors that are no parameters.
// The guard holds its copies in host memory, not on their device: a profiled step must find the
// device as training will, or the allocator's peak (the profile's resident_bytes, a peak budget's
// base) would count a second copy of the model.
// The recomputation's own snapshot of a region's buffers and modes, which re-points them for the
// recomputation instead of copying back, is ModuleStateSnapshot (module_state_snapshot.h).
#pragma once

#include "engine/generator_state.h"
#include "engine/module_modes.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::detail {

// What a ModelStateGuard records and puts back (bits, combined with |).
enum ModelStatePart : unsigned {
  kModes = 1,
  kParameters = 2,
  kBuffers = 4,
  kGrads = 8,
  kGenerators = 16,
  kWholeModelState = kModes | kParameters | kBuffers | kGrads | kGenerators,
};

class ModelStateGuard {
 public:
  // Records the `parts` of the state of `roots` and their submodules (a module or tensor
  // reached twice is recorded once); kGenerators also records the generator of `device` when it
  // is a CUDA device.
  ModelStateGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& roots, unsigned parts,
                  const std::optional<c10::Device>& device = std::nullopt);
  // Everything of `model`, and the generators of the CPU and of `device`.
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
  static void restore_value(Value& v);

  void record(const std::vector<torch::nn::Module*>& roots, unsigned parts,
              const std::optional<c10::Device>& device);

  int uncaught_on_entry_;
  ModuleModes modes_;
  std::vector<Value> values_;  // parameters and buffers, each once
  std::vector<Grad> grads_;
  GeneratorStash generators_;  // put back by restore(), not by its destructor
};

}  // namespace recompose::detail
