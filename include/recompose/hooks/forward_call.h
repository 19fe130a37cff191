// What a forward hook sees of one call of an annotated module's forward, and a stored copy of
// that call that its owner can run again.
#pragma once

#include <recompose/hooks/arg_traits.h>

#include <array>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::hooks {

/// A forward call kept for later: the module (held alive) and copies of the arguments.
/// Made by ForwardCall::store(). Thread-safe to invoke from any thread, one call at a time.
///
/// Example: run a call again later, with this API's own hooks off
/// ```
/// std::shared_ptr<recompose::hooks::StoredCall> stored = call.store();   // in a pre-hook
/// std::vector<at::Tensor> out = stored->invoke({}, "my_api");            // later
/// ```
class StoredCall {
 public:
  virtual ~StoredCall() = default;

  /// Runs the module's forward again with the stored arguments. `leaves` replaces the arguments'
  /// tensor leaves in flatten order (it must have leaf_count() entries); pass an empty vector to
  /// use the stored ones (only possible when the call was stored with its tensors).
  /// While it runs, on this thread, the hooks registered on this module with owner
  /// `suppressed_owner` are off; every other hook runs. Returns the output's tensor leaves.
  //
  /// Throws std::invalid_argument if `leaves` has the wrong size or tensors were not stored.
  virtual std::vector<at::Tensor> invoke(const std::vector<at::Tensor>& leaves,
                                         std::string_view suppressed_owner) const = 0;

  /// As invoke(), for a caller that does not need the output (a recomputation, whose tensors
  /// reach it through saved-tensor hooks): the output is dropped without being flattened.
  virtual void rerun(const std::vector<at::Tensor>& leaves,
                     std::string_view suppressed_owner) const = 0;

  /// Number of tensor leaves in the arguments.
  virtual std::size_t leaf_count() const = 0;

  /// The module whose forward this call runs.
  virtual torch::nn::Module& module() const = 0;
};

namespace detail {
// Type-erased access to the arguments of the call in flight (implemented in forward_gate.h).
class CallArguments {
 public:
  virtual ~CallArguments() = default;
  virtual std::vector<at::Tensor> leaves() const = 0;
  virtual std::shared_ptr<StoredCall> store(bool keep_tensors) const = 0;
};
}  // namespace detail

/// One call of an annotated forward, as hooks see it. Pre-hooks see the arguments; post-hooks see
/// the arguments, the output's tensor leaves, and, for always_call hooks, the exception that the
/// body or an earlier hook threw.
///
/// Example:
/// ```
/// recompose::hooks::register_forward_hook(*block, [](recompose::hooks::ForwardCall& c) {
///   if (c.has_output() && !c.output_leaves().empty())
///     std::cout << c.module().name() << " -> " << c.output_leaves()[0].sizes() << "\n";
/// });
/// ```
class ForwardCall {
 public:
  /// Made by the annotation's gate for each hooked call; hooks receive it, they do not make one.
  ForwardCall(torch::nn::Module& module, const detail::CallArguments& args)
      : module_(module), args_(args) {}
  ForwardCall(const ForwardCall&) = delete;
  ForwardCall& operator=(const ForwardCall&) = delete;

  /// The module whose forward is being called.
  torch::nn::Module& module() const { return module_; }

  /// Tensor leaves of the arguments, in order (an absent optional tensor is an undefined tensor).
  std::vector<at::Tensor> input_leaves() const { return args_.leaves(); }

  /// A copy of this call that can be run again later (see StoredCall). With keep_tensors = false
  /// the tensors are not kept (so no memory is held); invoke() must then be given the leaves.
  std::shared_ptr<StoredCall> store(bool keep_tensors = true) const {
    return args_.store(keep_tensors);
  }

  /// Post-hooks only: the output's tensor leaves (empty if the output type has no ArgTraits, or
  /// if the body threw).
  const std::vector<at::Tensor>& output_leaves() const {
    /// Flattened on first use: most post-hooks never look at them.
    if (output_ != nullptr) {
      output_leaves_ = flatten_output_(output_);
      output_ = nullptr;
    }
    return output_leaves_;
  }
  /// Post-hooks: whether the body returned (false in an always_call hook after it threw).
  bool has_output() const { return has_output_; }

  /// Post-hooks registered with always_call only: the exception in flight, or nullptr.
  std::exception_ptr error() const { return error_; }

  /// Per-call scratch space: what a pre-hook leaves here for a post-hook of the same call.
  /// Keyed by the hook owner's name; created empty on first use. The reference stays valid for
  /// the whole call, also when other owners add slots.
  ///   c.slot("my_api") = std::make_shared<int>(1);                       // in a pre-hook
  ///   auto n = std::static_pointer_cast<int>(c.slot("my_api"));          // in a post-hook
  std::shared_ptr<void>& slot(std::string_view owner);

  /// Used by the gate: `out` must stay alive while the post-hooks run.
  template <class R>
  void set_output(const R& out) {
    output_ = &out;
    flatten_output_ = [](const void* o) { return output_leaves_of(*static_cast<const R*>(o)); };
    has_output_ = true;
  }
  void set_void_output() { has_output_ = true; }
  void set_error(std::exception_ptr e) { error_ = std::move(e); }

 private:
  torch::nn::Module& module_;
  const detail::CallArguments& args_;
  // The output not flattened yet (null once flattened, or when there is none).
  mutable const void* output_ = nullptr;
  std::vector<at::Tensor> (*flatten_output_)(const void*) = nullptr;
  mutable std::vector<at::Tensor> output_leaves_;
  bool has_output_ = false;
  std::exception_ptr error_;
  // Slots in place for the usual one or two owners, names included (an API name is short), then
  // in a deque: adding a slot must not move the ones whose references hooks hold, and an empty
  // deque already allocates.
  struct InlineSlot {
    std::array<char, 32> name;
    std::size_t name_size = 0;
    std::shared_ptr<void> value;
    std::string_view owner() const { return {name.data(), name_size}; }
  };
  static constexpr std::size_t kInlineSlots = 2;
  std::array<InlineSlot, kInlineSlots> inline_slots_;
  std::size_t inline_used_ = 0;
  std::unique_ptr<std::deque<std::pair<std::string, std::shared_ptr<void>>>> more_slots_;
};

}  // namespace recompose::hooks
