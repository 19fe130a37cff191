// The random-number and autocast state a region's forward ran with, restored around its
// recomputation so that dropout masks and autocast choices match.
#pragma once

#include "engine/cpu_generator_adapter.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace recompose::detail {

struct AutocastState {
  c10::DeviceType device_type;
  bool enabled;
  at::ScalarType dtype;
};

struct ForwardState {
  // A plain copy when RNG state is preserved: cheaper than get_state's serialised tensor. Null
  // otherwise. Shared, immutable: consecutive regions whose forwards draw nothing see the same
  // state, and hold one copy of its ~2.5 KB instead of one each (see capture_forward_state).
  std::shared_ptr<const CpuGeneratorState> cpu_rng;
  std::vector<std::pair<c10::Device, at::Tensor>> device_rng;  // devices the inputs live on
  c10::SmallVector<AutocastState, 2> autocast;  // CPU and at most one device, almost always
  bool autocast_cache = true;
  // CUDA devices with no context yet at the region's entry: their RNG state did not exist to be
  // stashed, so a forward that initialises one cannot be replayed faithfully.
  std::vector<c10::DeviceIndex> uninitialised_cuda;
};

// Names a device that the region's forward initialised (see ForwardState::uninitialised_cuda),
// or returns an empty string.
std::string device_initialised_since(const ForwardState& state);

// Captures the state at a region's entry. RNG states only when preserve_rng is true.
ForwardState capture_forward_state(const std::vector<at::Tensor>& inputs, bool preserve_rng);

// Puts a captured state in place while alive, and restores the state it replaced.
class ForwardStateRestorer {
 public:
  explicit ForwardStateRestorer(const ForwardState& state);
  ~ForwardStateRestorer();
  ForwardStateRestorer(const ForwardStateRestorer&) = delete;
  ForwardStateRestorer& operator=(const ForwardStateRestorer&) = delete;

 private:
  ForwardState saved_;  // without its CPU generator state, which is kept here (no allocation)
  std::optional<CpuGeneratorState> saved_cpu_rng_;
  // False when the generator already held the forward's state: nothing was written, and
  // nothing needs writing back unless the recomputation drew.
  bool cpu_rng_written_ = false;
};

}  // namespace recompose::detail
