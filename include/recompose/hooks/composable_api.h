// One composable API (apply_checkpoint, apply_offload, your own): what every such API does the
// same way, in one place, after torch.distributed._composable's `contract`: refuse a module whose
// forward cannot be hooked with a message that says what to do instead, attach the API's state
// once, register its hooks under the API's name, undo everything if that fails, and find, test
// and remove it again from the module alone.
//
//   struct CounterState { int calls = 0; };
//   const recompose::hooks::ComposableApi<CounterState> counter("my.counter", "my::apply_counter");
//   counter.apply(*block, std::make_shared<CounterState>(),
//                 [](recompose::hooks::ApiHooks& hooks, std::weak_ptr<CounterState> state) {
//                   hooks.pre([state](recompose::hooks::ForwardCall&) {
//                     if (auto s = state.lock()) ++s->calls;
//                   });
//                 });
//   block(x);
//   counter.state(*block)->calls;        // 1
//   counter.remove(*block);              // hooks gone, state detached; is_applied(*block) is false
//
// Hooks should capture the state weakly (as above): the module owns its hooks and state, so a
// strong reference would keep the state alive forever.
#pragma once

#include <recompose/checkpoint_error.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/hooks/module_state.h>

#include <c10/util/Type.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

namespace recompose::hooks {

/// True if `module` is one of LibTorch's own modules (its type is in namespace torch::nn:
/// torch::nn::SequentialImpl, LinearImpl, TransformerEncoderLayerImpl, ...), whose forward nobody
/// can annotate with RECOMPOSE_FORWARD.
///
/// Example:
/// ```
/// recompose::hooks::is_libtorch_module(*torch::nn::Linear(4, 4));   // true
/// ```
bool is_libtorch_module(const torch::nn::Module& module);

/// The demangled type of `module` ("torch::nn::SequentialImpl", "MyBlockImpl").
///
/// Example:
/// ```
/// std::cout << recompose::hooks::module_type_name(*block) << "\n";   // "BlockImpl"
/// ```
std::string module_type_name(const torch::nn::Module& module);

/// What an API advises for a LibTorch module it cannot be applied to ("use checkpoint_sequential"):
/// the message's last sentence.
using BuiltinModuleAdvice = std::function<std::string(const torch::nn::Module&)>;

/// Throws std::invalid_argument unless `module`'s forward carries RECOMPOSE_FORWARD. The message
/// names `api_function` and the module's type, and says how to annotate it; for one of LibTorch's
/// own modules, which cannot be annotated, it says so and gives `advice(module)` instead.
///
/// Example:
/// ```
/// recompose::hooks::require_annotated_forward(*block, "my::apply_counter");
/// ```
void require_annotated_forward(const torch::nn::Module& module, std::string_view api_function,
                               const BuiltinModuleAdvice& advice = {});

/// The hooks one composable API registers on one module: each is owned by the API (its name is
/// the hook owner, so the API's StoredCall::invoke can switch them off), and they are removed
/// together when the API is removed or its apply fails. ComposableApi::apply hands one to its
/// `install` callable.
///
/// Example:
/// ```
/// hooks.pre([](recompose::hooks::ForwardCall& c) { /* before the body */ });
/// hooks.post([](recompose::hooks::ForwardCall& c) { /* after it */ },
///            recompose::hooks::HookOptions().always_call(true));
/// ```
class ApiHooks {
 public:
  /// The hooks of the API named `owner` on `module` (none registered yet).
  ApiHooks(torch::nn::Module& module, std::string owner)
      : module_(&module), owner_(std::move(owner)) {}
  /// Registers a forward pre-/post-hook; `options.owner` is replaced by the API's name. Throws
  /// what register_forward_pre_hook / register_forward_hook throw.
  void pre(ForwardHook hook, HookOptions options = {});
  void post(ForwardHook hook, HookOptions options = {});
  /// Removes every hook registered through this object.
  void remove_all();

 private:
  torch::nn::Module* module_;
  std::string owner_;
  std::vector<HookHandle> handles_;
};

/// True if `module` is an M: M is a module type (BlockImpl) or its holder (Block, made by
/// TORCH_MODULE(Block)). Derived types count (a dynamic_cast).
///
/// Example:
/// ```
/// recompose::hooks::is_module_of_type<Block>(*block);   // true, as is_module_of_type<BlockImpl>
/// ```
template <class M>
bool is_module_of_type(const torch::nn::Module& module) {
  if constexpr (requires { typename M::ContainedType; }) {
    return dynamic_cast<const typename M::ContainedType*>(&module) != nullptr;
  } else {
    return dynamic_cast<const M*>(&module) != nullptr;
  }
}

/// The demangled name of the module type M (of the module a holder holds).
///
/// Example:
/// ```
/// recompose::hooks::type_name_of<Block>();   // "BlockImpl"
/// ```
template <class M>
std::string type_name_of() {
  if constexpr (requires { typename M::ContainedType; }) {
    return c10::demangle(typeid(typename M::ContainedType).name());
  } else {
    return c10::demangle(typeid(M).name());
  }
}

/// Calls apply(m) on every module of `root`'s tree, `root` included, that `match` accepts: every
/// registered submodule at any depth, whatever C++ access the member holding it has (private
/// members, Sequential and ModuleList entries). A module reachable twice is applied once. All or
/// nothing: if apply throws, undo(m) is called on the modules already done, in reverse order,
/// then the exception goes on. Returns how many modules were applied; none is a
/// std::invalid_argument naming `api_function` ("recompose::apply_checkpoint_to") and `type_name`:
/// applying to nothing is a mistake the user would otherwise not see.
///
/// Example:
/// ```
/// int64_t n = recompose::hooks::apply_to_matching(
///     *model, "my::apply_counter_to", recompose::hooks::type_name_of<BlockImpl>(),
///     &recompose::hooks::is_module_of_type<BlockImpl>,
///     [&](torch::nn::Module& m) { apply_counter(m); },
///     [&](torch::nn::Module& m) { counter.remove(m); });
/// ```
int64_t apply_to_matching(torch::nn::Module& root, std::string_view api_function,
                          const std::string& type_name,
                          const std::function<bool(const torch::nn::Module&)>& match,
                          const std::function<void(torch::nn::Module&)>& apply,
                          const std::function<void(torch::nn::Module&)>& undo);

namespace detail {
// What the registry holds for an applied API: its state and its hooks.
template <class State>
struct AppliedApi {
  std::shared_ptr<State> state;
  ApiHooks hooks;
};
// How to make `module` hookable: where to put RECOMPOSE_FORWARD, or, for one of LibTorch's own
// modules, `advice` (or a generic alternative). The last sentences of the not-annotated errors.
std::string how_to_annotate(const torch::nn::Module& module, const BuiltinModuleAdvice& advice);
[[noreturn]] void throw_not_applied(const torch::nn::Module& module, std::string_view function,
                                    std::string_view api_function);
}  // namespace detail

/// One composable API with state of type State (see the header comment for an example).
template <class State>
class ComposableApi {
 public:
  /// `name`: the name the state is attached under (applied_apis) and the owner of the hooks.
  /// `api_function`: the public function that applies it, named in error messages
  /// ("recompose::apply_checkpoint"). `advice`: what to use instead on a LibTorch module.
  ComposableApi(std::string name, std::string api_function, BuiltinModuleAdvice advice = {})
      : name_(std::move(name)),
        api_function_(std::move(api_function)),
        advice_(std::move(advice)) {}

  /// The name the state is attached under.
  const std::string& name() const { return name_; }

  /// Attaches `state` to `module`, then calls install(ApiHooks&, std::weak_ptr<State>) to register
  /// the API's hooks. Returns the state.
  /// Throws std::invalid_argument if the module's forward is not annotated (see
  /// require_annotated_forward) or it is not owned by a std::shared_ptr, CompositionError if the
  /// API is already applied to it. If `install` throws, the hooks it registered are removed and
  /// the state detached before the exception goes on: the module is left as it was.
  template <class Install>
  std::shared_ptr<State> apply(torch::nn::Module& module, std::shared_ptr<State> state,
                               Install&& install) const {
    require_annotated_forward(module, api_function_, advice_);
    auto applied =
        attach_state(module, name_,
                     std::make_shared<detail::AppliedApi<State>>(
                         detail::AppliedApi<State>{std::move(state), ApiHooks(module, name_)}));
    try {
      std::forward<Install>(install)(applied->hooks, std::weak_ptr<State>(applied->state));
    } catch (...) {
      applied->hooks.remove_all();
      detach_state(module, name_);
      throw;
    }
    return applied->state;
  }

  /// Removes the API's hooks and detaches its state; false if it was not applied.
  bool remove(torch::nn::Module& module) const {
    auto applied = find(module);
    if (!applied) return false;
    applied->hooks.remove_all();
    detach_state(module, name_);
    return true;
  }

  /// True if the API is applied to `module`.
  bool is_applied(const torch::nn::Module& module) const { return find(module) != nullptr; }

  /// The state attached by apply(), or nullptr if the API is not applied to `module`.
  std::shared_ptr<State> state(const torch::nn::Module& module) const {
    auto applied = find(module);
    return applied ? applied->state : nullptr;
  }

  /// As state(), but throws CheckpointError naming `function` (the caller,
  /// "recompose::offload_stats") and the apply function when the API is not applied.
  std::shared_ptr<State> state_or_throw(const torch::nn::Module& module,
                                        std::string_view function) const {
    auto s = state(module);
    if (!s) detail::throw_not_applied(module, function, api_function_);
    return s;
  }

 private:
  std::shared_ptr<detail::AppliedApi<State>> find(const torch::nn::Module& module) const {
    return find_state<detail::AppliedApi<State>>(module, name_);
  }

  std::string name_;
  std::string api_function_;
  BuiltinModuleAdvice advice_;
};

}  // namespace recompose::hooks
