// The process-wide overrides behind set_checkpoint_early_stop / set_checkpoint_debug_enabled.
#pragma once

#include <optional>

namespace recompose::detail {
std::optional<bool> early_stop_override();
std::optional<bool> debug_override();
}  // namespace recompose::detail
