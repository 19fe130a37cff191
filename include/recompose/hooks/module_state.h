// Typed state that a composable API attaches to a module, like torch.distributed._composable's
// `contract`: apply_checkpoint attaches its state to the module it checkpoints and finds it again
// from the module alone; the module tree itself does not change.
//
//   struct MyApiState { int calls = 0; };
//   auto st = recompose::hooks::attach_state(*block, "my_api", std::make_shared<MyApiState>());
//   recompose::hooks::find_state<MyApiState>(*block, "my_api")->calls++;
//   recompose::hooks::applied_apis(*block);   // {"my_api"}
//   recompose::hooks::detach_state(*block, "my_api");
//
// The registry holds a state until it is detached or its module dies (then it is released at
// the next purge, see module_lifetime.h); a copy of the shared_ptr kept elsewhere keeps it alive.
#pragma once

#include <recompose/checkpoint_error.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeindex>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::hooks {

/// Thrown when a composable API is applied twice to the same module, or its state is asked for
/// with the wrong type. A recompose::CheckpointError, as every error recompose raises.
///
/// Example:
/// ```
/// recompose::apply_checkpoint(block);
/// try {
///   recompose::apply_checkpoint(block);
/// } catch (const recompose::hooks::CompositionError& e) {   // already checkpointed
/// }
/// ```
class CompositionError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

namespace detail {
void attach_state_erased(torch::nn::Module& module, std::string_view api,
                         std::shared_ptr<void> state, std::type_index type);
std::shared_ptr<void> find_state_erased(const torch::nn::Module& module, std::string_view api,
                                        std::type_index type);
}  // namespace detail

/// Attaches `state` to `module` under the API name `api` and returns it.
/// Throws CompositionError if `api` is already applied to this module, std::invalid_argument if
/// `api` is empty or the module is not owned by a std::shared_ptr.
///
/// Example:
/// ```
/// auto st = recompose::hooks::attach_state(*block, "my_api", std::make_shared<MyApiState>());
/// ```
template <class State>
std::shared_ptr<State> attach_state(torch::nn::Module& module, std::string_view api,
                                    std::shared_ptr<State> state) {
  detail::attach_state_erased(module, api, state, std::type_index(typeid(State)));
  return state;
}

/// The state attached under `api`, or nullptr if that API is not applied to the module.
/// Throws CompositionError if it was attached with another type than State.
///
/// Example:
/// ```
/// if (auto st = recompose::hooks::find_state<MyApiState>(*block, "my_api")) ++st->calls;
/// ```
template <class State>
std::shared_ptr<State> find_state(const torch::nn::Module& module, std::string_view api) {
  return std::static_pointer_cast<State>(
      detail::find_state_erased(module, api, std::type_index(typeid(State))));
}

/// Removes the state attached under `api`; returns false if there was none.
///
/// Example:
/// ```
/// recompose::hooks::detach_state(*block, "my_api");
/// ```
bool detach_state(torch::nn::Module& module, std::string_view api);

/// Names of the APIs applied to `module`, in the order they were applied.
///
/// Example:
/// ```
/// recompose::apply_checkpoint(block);
/// recompose::hooks::applied_apis(*block);   // {"recompose.checkpoint"}
/// ```
std::vector<std::string> applied_apis(const torch::nn::Module& module);

}  // namespace recompose::hooks
