// Read-only counters of the hook registry, for tests and diagnostics (not a stable API).
#pragma once

#include <cstddef>

namespace recompose::hooks::detail {

struct RegistryStats {
  // Entries in the table, including those of destroyed modules not yet purged.
  std::size_t entries = 0;
  // Entries with at least one hook; 0 means forwards skip the table lookup.
  std::size_t hooked_modules = 0;
};

// The registry's counters now. Purges nothing, so a test can see what a trigger changed.
RegistryStats registry_stats();

}  // namespace recompose::hooks::detail
