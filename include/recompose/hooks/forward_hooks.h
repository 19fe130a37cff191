// Forward pre- and post-hooks for LibTorch modules whose forward carries RECOMPOSE_FORWARD.
//
//   struct BlockImpl : torch::nn::Module {
//     torch::Tensor forward(torch::Tensor x) {
//       RECOMPOSE_FORWARD(x);          // first statement: makes the forward hookable
//       return fc->forward(x).relu();
//     }
//     torch::nn::Linear fc{nullptr};
//   };
//   TORCH_MODULE(Block);
//
//   Block block;
//   auto h = recompose::hooks::register_forward_hook(*block, [](recompose::hooks::ForwardCall& c) {
//     std::cout << c.output_leaves()[0].sizes() << "\n";
//   });
//   block(torch::randn({2, 4}));        // the hook runs, however the module is called
//   h.remove();
//
// Hooks run on the thread that runs the forward. Registration and removal are thread-safe and
// may happen while other threads run the module, or from inside a running hook. Hooks are
// destroyed with their module (see module_lifetime.h).
#pragma once

#include <recompose/hooks/forward_call.h>
#include <recompose/hooks/module_lifetime.h>  // hooks die with their module; purge_expired()

#include <torch/arg.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace recompose::hooks {

/// A forward pre- or post-hook: called with the call it runs around (see ForwardCall).
using ForwardHook = std::function<void(ForwardCall&)>;

/// How a hook is registered (register_forward_pre_hook, register_forward_hook, ApiHooks).
///
/// Example:
/// ```
/// recompose::hooks::register_forward_hook(
///     *block,
///     [](recompose::hooks::ForwardCall& c) {
///       if (c.error()) std::cerr << "the forward threw\n";
///     },
///     recompose::hooks::HookOptions().owner("my_api").always_call(true));
/// ```
struct HookOptions {
  /// Run before the hooks already registered (of the same kind) instead of after them.
  /// Default: false
  TORCH_ARG(bool, prepend) = false;
  /// Post-hooks only (register_forward_pre_hook throws std::invalid_argument when it is set): run
  /// even when the body or an earlier hook threw; the exception then goes on (an exception thrown
  /// by an always_call hook itself in that situation is dropped). Default: false
  TORCH_ARG(bool, always_call) = false;
  /// Who owns the hook: StoredCall::invoke can switch off one owner's hooks. Default: "" (no
  /// owner: never switched off)
  TORCH_ARG(std::string, owner);
};

namespace detail {
struct HookRecord;
}

/// Removes the hook it was returned for. Dropping the handle does NOT remove the hook (as in
/// PyTorch). remove() is idempotent, thread-safe, and safe inside a running hook: a removed hook
/// does not run again, not even later in the call that is in flight. A hook dies with its module
/// (see module_lifetime.h): once the dead module's entry is purged, the handle is inactive, no
/// longer holds the hook's callable, and remove() does nothing.
///
/// Example:
/// ```
/// auto h = recompose::hooks::register_forward_pre_hook(*block, hook);
/// block(x);
/// h.remove();   // h.active() is false from here on
/// ```
class HookHandle {
 public:
  /// An inactive handle (remove() does nothing).
  HookHandle() = default;
  explicit HookHandle(const std::shared_ptr<detail::HookRecord>& record) : record_(record) {}
  /// Removes the hook, if it is still registered.
  void remove();
  /// Whether the hook is still registered (not removed, its module's entry not purged).
  bool active() const;

 private:
  // Weak: the module's hook lists own the record and its callable, which die with the module's
  // entry whether or not a handle is kept.
  std::weak_ptr<detail::HookRecord> record_;
};

/// Registers `hook` to run before the body of `module`'s forward, with `options` (prepend, owner);
/// it sees the arguments. Returns the handle that removes it.
/// Throws std::invalid_argument if `hook` is empty, the module's forward is not annotated with
/// RECOMPOSE_FORWARD (the message names the type), options.always_call() is set (post-hooks
/// only), or the module is not owned by a std::shared_ptr (every ModuleHolder and
/// std::make_shared module is).
///
/// Example:
/// ```
/// auto h = recompose::hooks::register_forward_pre_hook(
///     *block, [](recompose::hooks::ForwardCall& c) {
///       std::cout << c.input_leaves().size() << " tensor arguments\n";
///     });
/// ```
HookHandle register_forward_pre_hook(torch::nn::Module& module, ForwardHook hook,
                                     HookOptions options = {});

/// Registers `hook` to run after the body of `module`'s forward, with `options` (prepend,
/// always_call, owner); it sees the arguments and the output's tensor leaves. Returns the handle
/// that removes it. Errors as register_forward_pre_hook (always_call allowed).
///
/// Example:
/// ```
/// auto h = recompose::hooks::register_forward_hook(*block, [](recompose::hooks::ForwardCall& c) {
///   std::cout << c.output_leaves()[0].sizes() << "\n";
/// });
/// ```
HookHandle register_forward_hook(torch::nn::Module& module, ForwardHook hook,
                                 HookOptions options = {});

/// True if `module`'s dynamic type has an annotated forward (RECOMPOSE_FORWARD).
///
/// Example:
/// ```
/// if (recompose::hooks::has_annotated_forward(*block)) recompose::apply_checkpoint(block);
/// ```
bool has_annotated_forward(const torch::nn::Module& module);

/// Number of hooks (pre and post) currently registered on `module`.
///
/// Example:
/// ```
/// assert(recompose::hooks::hook_count(*block) == 0);   // nothing attached yet
/// ```
std::size_t hook_count(const torch::nn::Module& module);

}  // namespace recompose::hooks
