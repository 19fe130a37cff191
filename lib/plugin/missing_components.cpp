// Stand-ins registered, as plug-ins, for the components this build leaves out
// (-Dselective=disabled, -Dswap=disabled): options that ask for a missing component fail with a
// CheckpointError that says so, instead of being ignored. (The missing component's own API,
// SelectivePolicy or SwapManager, is absent at link time: its header is installed, its definitions
// are not.)
#include "engine/region_plugin.h"

#include <recompose/checkpoint_error.h>

namespace recompose::detail {
namespace {

class MissingSelective final : public RegionPlugin {
 public:
  const char* name() const override { return "selective checkpointing (not built)"; }
  void validate(const CheckpointOptions& options) const override {
    if (options.policy()) {
      throw CheckpointError(
          "recompose: CheckpointOptions::policy needs selective checkpointing, but this build of "
          "recompose has none (it was configured with -Dselective=disabled). Rebuild with "
          "-Dselective=enabled, or leave the policy unset.");
    }
  }
};

class MissingSwap final : public RegionPlugin {
 public:
  const char* name() const override { return "activation swap (not built)"; }
  void validate(const CheckpointOptions& options) const override {
    if (options.swap_inputs()) {
      throw CheckpointError(
          "recompose: CheckpointOptions::swap_inputs(true) needs activation swap, but this build "
          "of recompose has none (it was configured with -Dswap=disabled). Rebuild with "
          "-Dswap=enabled, or leave swap_inputs off.");
    }
  }
};

}  // namespace

void register_missing_selective_plugin() {
  add_region_plugin(std::make_shared<MissingSelective>());
}
void register_missing_swap_plugin() { add_region_plugin(std::make_shared<MissingSwap>()); }

}  // namespace recompose::detail
