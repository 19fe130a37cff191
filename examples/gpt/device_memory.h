// Peak memory of a training step, on CPU and CUDA alike: recompose's readers
// (recompose/device_memory.h), the CUDA caching allocator's counters on a GPU and, on CPU, the
// counts of recompose::CpuMemoryCounting, which main() keeps on for the whole run: it sees every
// allocation of a step (activations, gradients, temporaries), where recompose::SavedTensorMeter
// sees only what is held for backward.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gpt {

// Starts a new peak measurement on `device`.
void reset_peak_memory(const torch::Device& device);
// Peak bytes of tensor memory allocated on `device` since the last reset (0 where not measured).
int64_t peak_memory(const torch::Device& device);
// Bytes of tensor memory allocated on `device` now.
int64_t current_memory(const torch::Device& device);
// Caps the CUDA caching allocator at `fraction` of the device's memory (allocations beyond it
// fail as out of memory), after giving its cached blocks back; returns false (and does nothing)
// elsewhere.
bool cap_device_memory(const torch::Device& device, double fraction);
// Waits for the device's queued work, so that wall-clock timings cover it.
void synchronize(const torch::Device& device);

}  // namespace gpt
