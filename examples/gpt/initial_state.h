// The model's weights and the CPU generator's state before the first step, written for Python's
// torch.load: the Python peer (examples/gpt/python/gpt_peer.py) trains the same model from the
// same numbers, so that C++ and Python steps can be compared loss for loss.
#pragma once

#include "model.h"

#include <filesystem>

namespace gpt {

// Writes a dict {"param.<name>": tensor, ..., "cpu_rng_state": uint8 tensor} with
// torch::pickle_save (Python: torch.load(path, weights_only=True) with
// torch.jit._pickle.restore_type_tag in safe_globals). Throws std::runtime_error
// when the file cannot be written.
void save_initial_state(const std::filesystem::path& path, GPTImpl& model);

}  // namespace gpt
