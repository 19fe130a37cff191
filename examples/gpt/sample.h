// Text generation from a trained model: shows what the loss curve means.
#pragma once

#include "data.h"
#include "model.h"

#include <cstdint>
#include <string>

namespace gpt {

// Continues `prompt` by `length` characters, sampling each from the softmax of the logits.
std::string sample(GPT& model, const CharDataset& data, const std::string& prompt, int64_t length,
                   uint64_t seed, const torch::Device& device);

}  // namespace gpt
