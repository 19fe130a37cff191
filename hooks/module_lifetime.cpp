// Purging the entries of destroyed modules, and the registry's counters.
#include "module_registry.h"

#include <recompose/hooks/module_lifetime.h>
#include <recompose/hooks/registry_stats.h>

#include <mutex>

namespace recompose::hooks {

std::size_t purge_expired() { return detail::ModuleRegistry::instance().purge_expired(); }

namespace detail {

RegistryStats registry_stats() {
  auto& reg = ModuleRegistry::instance();
  std::shared_lock lock(reg.mutex());
  return RegistryStats{reg.entry_count(), static_cast<std::size_t>(reg.hooked_modules().load())};
}

}  // namespace detail
}  // namespace recompose::hooks
