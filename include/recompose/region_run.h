// The protocol of one invocation of a checkpointed region, shared by apply_checkpoint's hooks
// and the functional checkpoint(): begin before the body, end after it (or after it threw).
// Internally a C++20 coroutine (lib/engine/region_generator.cpp) that runs the pre-forward
// step, suspends while the body runs and runs the post-forward step, like PyTorch's
// _checkpoint_without_reentrant_generator.
#pragma once

#include <recompose/checkpoint_options.h>

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>
#include <memory>
#include <vector>

namespace recompose::detail {

// Runs the region's body again with `input_leaves` in place of the original tensor arguments.
using RecomputeFn = std::function<void(const std::vector<at::Tensor>& input_leaves)>;

// Throws CheckpointError if `options` contradict each other (policy together with context_fn).
void validate_options(const CheckpointOptions& options);

class RegionRun {
 public:
  // Pre-forward step. With grad mode off (or in inference mode) no region is made and the body
  // runs plainly; active() is then false. `owner` is the checkpointed module (apply_checkpoint),
  // whose state is preserved like options.state_modules().
  static RegionRun begin(const CheckpointOptions& options,
                         const std::vector<at::Tensor>& input_leaves, RecomputeFn recompute,
                         std::shared_ptr<torch::nn::Module> owner = nullptr);

  // Post-forward step; `body_error` is the exception the body threw, or nullptr.
  void end(std::exception_ptr body_error);

  bool active() const { return state_ != nullptr; }

  // The region as a type-erased shared handle, and back: a hook hands the region from its
  // pre-hook to its post-hook through a per-call slot without an allocation of its own. An
  // inactive region gives a null handle.
  std::shared_ptr<void> into_handle() && { return std::move(state_); }
  static RegionRun from_handle(std::shared_ptr<void> handle) {
    return RegionRun(std::static_pointer_cast<State>(std::move(handle)));
  }

  RegionRun(RegionRun&&) noexcept = default;
  RegionRun& operator=(RegionRun&&) noexcept = default;
  RegionRun(const RegionRun&) = delete;
  RegionRun& operator=(const RegionRun&) = delete;
  ~RegionRun();

  struct State;

 private:
  explicit RegionRun(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace recompose::detail
