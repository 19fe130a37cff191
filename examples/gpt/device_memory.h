// Peak memory of a training step, on CPU and CUDA alike. CUDA has the caching allocator's
// counters. CPU has none, so the example installs a thin counting wrapper around LibTorch's CPU
// allocator: it sees every allocation of a step (activations, gradients, temporaries), where
// recompose::SavedTensorMeter sees only what is held for backward.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gpt {

// Routes CPU tensor allocations through the counter. Call once, before building the model;
// tensors allocated earlier are simply not counted.
void install_cpu_memory_counter();

// Starts a new peak measurement on `device`.
void reset_peak_memory(const torch::Device& device);
// Peak bytes of tensor memory allocated on `device` since the last reset.
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
