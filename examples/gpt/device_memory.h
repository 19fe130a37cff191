// Peak device memory of a training step. On CUDA this is the caching allocator's peak of
// allocated bytes; CPU has no such counter, so there the example reports the bytes autograd
// holds for backward (recompose::SavedTensorMeter) instead.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace gpt {

// Starts a new peak measurement on `device` (no-op off CUDA).
void reset_peak_memory(const torch::Device& device);
// Peak bytes allocated on `device` since the last reset, or nullopt when it has no counter.
std::optional<int64_t> peak_memory(const torch::Device& device);
// Waits for the device's queued work, so that wall-clock timings cover it.
void synchronize(const torch::Device& device);

}  // namespace gpt
