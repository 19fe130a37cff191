#include "plugin/offload.h"

#include "engine/region_plugin.h"

#include <recompose/checkpoint_error.h>

#include <atomic>

namespace recompose::detail {
namespace {
std::atomic<OffloaderFactory> g_factory{nullptr};
}  // namespace

void set_offloader_factory(OffloaderFactory factory) { g_factory.store(factory); }

std::shared_ptr<Offloader> make_offloader(std::shared_ptr<SwapManager> manager) {
  (void)region_plugins();  // the providers register with the plug-ins
  if (OffloaderFactory factory = g_factory.load()) return factory(std::move(manager));
  throw CheckpointError(
      "recompose: selective checkpoint: a policy chose CheckpointPolicy::MUST_SWAP, but this build "
      "of recompose "
      "has no activation swap (it was configured with -Dswap=disabled). Rebuild with "
      "-Dswap=enabled, or "
      "return MUST_SAVE instead.");
}

}  // namespace recompose::detail
