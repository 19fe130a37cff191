#include "engine/region_plugin.h"

#include <recompose/checkpoint_error.h>

#include <atomic>
#include <utility>

namespace recompose::detail {
namespace {

std::atomic<bool> g_sealed{false};

RegionPluginList& pending() {
  static RegionPluginList list;
  return list;
}

}  // namespace

void add_region_plugin(std::shared_ptr<const RegionPlugin> plugin) {
  if (g_sealed.load()) {
    throw CheckpointError(
        std::string("recompose: the region plug-in \"") + plugin->name() +
        "\" was added after the first checkpointed region ran. Register plug-ins from a "
        "function that register_builtin_plugins() calls (lib/meson.build, recompose_plugins).");
  }
  pending().push_back(std::move(plugin));
}

const RegionPluginList& region_plugins() {
  static const RegionPluginList list = [] {
    register_builtin_plugins();
    g_sealed.store(true);
    return std::move(pending());
  }();
  return list;
}

}  // namespace recompose::detail
