// is_checkpointing / is_recomputing and the process-wide switches.
#include "engine/checkpoint_frame.h"
#include "region_switches.h"

#include <recompose/checkpoint_state.h>

#include <atomic>

namespace recompose {
namespace {
// -1: not set; 0/1: forced value. Process-wide, as in PyTorch (module globals).
std::atomic<int> g_early_stop{-1};
std::atomic<int> g_debug{-1};

std::optional<bool> read(const std::atomic<int>& v) {
  const int x = v.load();
  if (x < 0) return std::nullopt;
  return x == 1;
}
}  // namespace

namespace detail {
std::optional<bool> early_stop_override() { return read(g_early_stop); }
std::optional<bool> debug_override() { return read(g_debug); }
}  // namespace detail

bool is_checkpointing() { return detail::CheckpointDepth::forward() > 0; }
bool is_recomputing() { return detail::CheckpointDepth::recompute() > 0; }

SwitchGuard::SwitchGuard(SwitchGuard&& other) noexcept
    : which_(other.which_), previous_(other.previous_), active_(std::exchange(other.active_, false)) {}

SwitchGuard::~SwitchGuard() {
  if (!active_) return;
  (which_ == Which::EarlyStop ? g_early_stop : g_debug).store(previous_);
}

SwitchGuard set_checkpoint_early_stop(bool enable) {
  return SwitchGuard(SwitchGuard::Which::EarlyStop, g_early_stop.exchange(enable ? 1 : 0));
}

SwitchGuard set_checkpoint_debug_enabled(std::optional<bool> enable) {
  return SwitchGuard(SwitchGuard::Which::Debug, g_debug.exchange(enable.has_value() ? (*enable ? 1 : 0) : -1));
}

}  // namespace recompose
