// Where the calling thread is with respect to checkpointing, and the process-wide switches.
#pragma once

#include <cstdint>
#include <optional>

namespace recompose {

/// True while the forward of a checkpointed region runs on this thread (also inside a
/// recomputation, for the regions it meets). Does not throw.
///
/// Example:
/// ```
/// recompose::checkpoint([](const torch::Tensor& x) {
///   assert(recompose::is_checkpointing());
///   return x.sin();
/// }, x);
/// ```
bool is_checkpointing();

/// True while a checkpointed region is being recomputed on this thread (during backward, or
/// during a backward inside a region's forward). Hooks of other components, such as a sharded
/// trainer's unshard/reshard hooks, use it to tell recomputation from the original forward.
/// Does not throw.
///
/// Example:
/// ```
/// recompose::hooks::register_forward_pre_hook(*block, [](recompose::hooks::ForwardCall&) {
///   if (!recompose::is_recomputing()) ++forward_calls;   // count original forwards only
/// });
/// ```
bool is_recomputing();

/// Holds a process-wide switch while alive (made by set_checkpoint_early_stop and
/// set_checkpoint_debug_enabled; movable, not copyable). Guards may end in any order: the switch
/// follows the most recently made guard that is still alive, and is unset when none is.
class [[nodiscard]] SwitchGuard {
 public:
  SwitchGuard(const SwitchGuard&) = delete;
  SwitchGuard& operator=(const SwitchGuard&) = delete;
  SwitchGuard(SwitchGuard&& other) noexcept;
  ~SwitchGuard();

 private:
  friend SwitchGuard set_checkpoint_early_stop(bool enable);
  friend SwitchGuard set_checkpoint_debug_enabled(std::optional<bool> enable);
  enum class Which { EarlyStop, Debug };
  SwitchGuard(Which which, int value);
  Which which_;
  uint64_t id_;  // this guard's entry in the switch's stack
  bool active_ = true;
};

/// While the returned guard lives, regions whose forward runs decide early stop by `enable`
/// instead of CheckpointOptions::early_stop, on every thread (like
/// torch.utils.checkpoint.set_checkpoint_early_stop). Only forward time matters: the choice is
/// recorded in the region.
///
/// Example:
/// ```
/// { auto g = recompose::set_checkpoint_early_stop(false); loss = model(x).sum(); }
/// loss.backward();   // recomputes every region to its end
/// ```
SwitchGuard set_checkpoint_early_stop(bool enable);

/// While the returned guard lives, debug mode (CheckpointOptions::debug) of the regions whose
/// forward runs is forced on (true), off (false), or left to the options (nullopt), on every
/// thread, like torch.utils.checkpoint.set_checkpoint_debug_enabled.
///
/// Example:
/// ```
/// auto g = recompose::set_checkpoint_debug_enabled(true);   // determinism errors list the ops
/// model(x).sum().backward();
/// ```
SwitchGuard set_checkpoint_debug_enabled(std::optional<bool> enable);

}  // namespace recompose
