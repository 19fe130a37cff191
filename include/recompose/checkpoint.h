// Functional activation checkpointing: checkpoint(fn, args...) and checkpoint_sequential.
//
//   torch::Tensor y = recompose::checkpoint([&](const torch::Tensor& x) { return mlp(x); }, x);
//   torch::Tensor z = recompose::checkpoint(
//       recompose::CheckpointOptions().early_stop(false),
//       [&](const torch::Tensor& a, double s) { return f(a) * s; }, x, 0.5);
//   torch::Tensor out = recompose::checkpoint_sequential(seq, /*segments=*/4, x);
//
// Tensors that the body saves for backward are not kept: backward recomputes them by running
// `fn` again with the same arguments (non-reentrant checkpointing, torch.utils.checkpoint with
// use_reentrant=False). `fn` is copied and kept until backward: whatever it captures by
// reference must outlive backward. Arguments follow recompose::hooks::ArgTraits (tensors,
// optional tensors, tensor vectors, tuples/pairs, plain values). With grad mode off the body
// simply runs.
#pragma once

#include <recompose/checkpoint_error.h>
#include <recompose/checkpoint_options.h>
#include <recompose/hooks/arg_traits.h>
#include <recompose/region_run.h>

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace recompose {

/// Runs fn(args...) as a checkpointed region with `options` and returns what fn returns: the
/// tensors fn saves for backward are dropped, and backward recomputes them by calling fn again
/// with the same arguments. With grad mode off (or in inference mode) fn simply runs.
///
/// `fn`: any callable taking `args`; copied and kept until backward. `args`: types that
/// recompose::hooks::ArgTraits supports (a compile error names one that is not).
///
/// Throws CheckpointError if `options` are contradictory (policy together with context_fn), and
/// during backward if the recomputation differs from the forward (see DeterminismCheck); whatever
/// fn throws goes through.
///
/// Example:
/// ```
/// torch::Tensor z = recompose::checkpoint(
///     recompose::CheckpointOptions().early_stop(false),
///     [&](const torch::Tensor& a, double s) { return f(a) * s; }, x, 0.5);
/// ```
template <class Fn, class... Args>
decltype(auto) checkpoint(const CheckpointOptions& options, Fn fn, Args&&... args) {
  static_assert((hooks::Flattenable<std::decay_t<Args>> && ...),
                "recompose: checkpoint: an argument type is not supported; specialise "
                "recompose::hooks::ArgTraits for it");
  using Stored = std::tuple<std::decay_t<Args>...>;
  std::vector<at::Tensor> leaves;
  (hooks::ArgTraits<std::decay_t<Args>>::flatten(args, leaves), ...);
  // Keep the structure of the arguments, not their tensors: the region saves those itself.
  const std::vector<at::Tensor> blanks(leaves.size());
  hooks::LeafCursor blank_cursor(blanks);
  auto structure = std::make_shared<const Stored>(
      Stored{hooks::ArgTraits<std::decay_t<Args>>::rebuild(args, blank_cursor)...});
  auto recompute = [fn, structure](const std::vector<at::Tensor>& input_leaves) {
    hooks::LeafCursor cursor(input_leaves);
    Stored rebuilt = std::apply(
        [&](const auto&... a) {
          return Stored{hooks::ArgTraits<std::decay_t<decltype(a)>>::rebuild(a, cursor)...};
        },
        *structure);
    std::apply([&](auto&... a) { (void)fn(a...); }, rebuilt);
  };
  auto region = detail::RegionRun::begin(options, leaves, std::move(recompute));
  try {
    if constexpr (std::is_void_v<decltype(fn(args...))>) {
      fn(args...);
      region.end(nullptr);
      return;
    } else {
      decltype(auto) out = fn(args...);
      region.end(nullptr);
      return out;
    }
  } catch (...) {
    region.end(std::current_exception());
    throw;
  }
}

/// checkpoint(fn, args...) with default CheckpointOptions.
///
/// Example:
/// ```
/// torch::Tensor y = recompose::checkpoint([&](const torch::Tensor& x) { return mlp(x); }, x);
/// ```
template <class Fn, class... Args>
requires(!std::is_same_v<std::decay_t<Fn>, CheckpointOptions>) decltype(auto)
    checkpoint(Fn fn, Args&&... args) {
  return checkpoint(CheckpointOptions{}, std::move(fn), std::forward<Args>(args)...);
}

/// Splits `sequential` into `segments` consecutive runs of modules and checkpoints every run but
/// the last (as torch.utils.checkpoint.checkpoint_sequential does: runs of size / segments
/// modules, the last run taking what is left); returns the output for `input`. Each run is
/// checkpoint()ed with `options`, its modules added to state_modules. Each module must take and
/// return one tensor. Throws std::invalid_argument if segments < 1 or segments > the number of
/// modules, and what checkpoint() throws.
///
/// Example:
/// ```
/// torch::nn::Sequential seq(torch::nn::Linear(64, 64), torch::nn::ReLU(),
///                           torch::nn::Linear(64, 64), torch::nn::ReLU());
/// torch::Tensor out = recompose::checkpoint_sequential(seq, /*segments=*/2, x);
/// ```
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                    const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

}  // namespace recompose
