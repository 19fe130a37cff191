// The error type of recompose.
//
// Every error recompose raises is a recompose::CheckpointError (or one of its documented
// subclasses), with a message that says what was wrong and how to fix it. The one exception is
// an invalid argument to an API call, detected before anything was done: that is a
// std::invalid_argument, documented at each function that throws it:
//   - hooks::register_forward_pre_hook / register_forward_hook (empty hook, unannotated module,
//     module not owned by a std::shared_ptr), hooks::attach_state (empty API name, module not
//     owned by a std::shared_ptr), apply_checkpoint (same),
//     hooks::StoredCall::invoke (wrong number of replacement tensors);
//   - checkpoint_sequential (segments out of range);
//   - SelectivePolicy / CheckpointOptions::policy (unknown op name, empty policy function);
//   - SwapOptions values out of range (SwapManager::create).
// Errors of the user's own code (a forward or a hook that throws) go through unchanged.
//
// Subclasses:
//   - hooks::CompositionError (recompose/hooks/module_state.h): a composable API applied twice
//     to one module, or its state asked for with the wrong type.
//
// This header depends on nothing and is shared by every layer (see docs/architecture.md).
#pragma once

#include <stdexcept>
#include <string>

namespace recompose {

/// Thrown for checkpointing errors: recomputation that differs from the original forward
/// (determinism check), a saved tensor unpacked twice or modified in place, a region used in an
/// unsupported way, misuse of the API, a component missing from this build, and internal errors.
/// Derives from std::runtime_error, as PyTorch's CheckpointError derives from RuntimeError.
///
/// Example:
/// ```
/// try {
///   loss.backward();
/// } catch (const recompose::CheckpointError& e) {
///   std::cerr << e.what() << "\n";   // what was wrong and how to fix it
/// }
/// ```
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace recompose
