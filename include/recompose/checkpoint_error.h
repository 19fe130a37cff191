// The error type of recompose's checkpointing.
#pragma once

#include <stdexcept>
#include <string>

namespace recompose {

// Thrown for checkpointing errors: recomputation that differs from the original forward
// (determinism check), a saved tensor unpacked twice, a region used in an unsupported way, and
// misuse of the API. Derives from std::runtime_error, as PyTorch's CheckpointError derives from
// RuntimeError.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace recompose
