// is_checkpointing / is_recomputing and the process-wide switches.
#include "engine/checkpoint_depth.h"
#include "engine/region_switches.h"

#include <recompose/checkpoint_state.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace recompose {
namespace {

// Process-wide, as in PyTorch (module globals). Each switch is a stack of the values of the
// guards alive, oldest first, so that guards ended out of order never resurrect a value.
struct Switch {
  struct Entry {
    uint64_t id;
    int value;  // 0 false, 1 true, -1 "leave it to the options"
  };
  std::vector<Entry> entries;
  std::atomic<int> current{-1};  // read on every region's forward without the lock
};

std::mutex g_mutex;
uint64_t g_next_id = 0;
Switch g_early_stop;
Switch g_debug;

Switch& switch_of(bool early_stop) { return early_stop ? g_early_stop : g_debug; }

void publish(Switch& s) { s.current.store(s.entries.empty() ? -1 : s.entries.back().value); }

std::optional<bool> read(const Switch& s) {
  const int x = s.current.load();
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

SwitchGuard::SwitchGuard(Which which, int value) : which_(which) {
  std::lock_guard lock(g_mutex);
  id_ = g_next_id++;
  Switch& s = switch_of(which == Which::EarlyStop);
  s.entries.push_back({id_, value});
  publish(s);
}

SwitchGuard::SwitchGuard(SwitchGuard&& other) noexcept
    : which_(other.which_), id_(other.id_), active_(std::exchange(other.active_, false)) {}

SwitchGuard::~SwitchGuard() {
  if (!active_) return;
  std::lock_guard lock(g_mutex);
  Switch& s = switch_of(which_ == Which::EarlyStop);
  std::erase_if(s.entries, [this](const Switch::Entry& e) { return e.id == id_; });
  publish(s);
}

SwitchGuard set_checkpoint_early_stop(bool enable) {
  return SwitchGuard(SwitchGuard::Which::EarlyStop, enable ? 1 : 0);
}

SwitchGuard set_checkpoint_debug_enabled(std::optional<bool> enable) {
  return SwitchGuard(SwitchGuard::Which::Debug, enable.has_value() ? (*enable ? 1 : 0) : -1);
}

}  // namespace recompose
