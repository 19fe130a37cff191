// Selective checkpointing as a region plug-in: CheckpointOptions::policy(...) becomes the
// region's contexts.
#include "engine/region_plugin.h"

#include <recompose/checkpoint_error.h>
#include <recompose/selective_checkpoint.h>

namespace recompose::detail {
namespace {

class SelectivePlugin final : public RegionPlugin {
 public:
  const char* name() const override { return "selective checkpointing"; }
  void validate(const CheckpointOptions& options) const override {
    if (options.context_fn() && options.policy()) {
      throw CheckpointError(
          "recompose: CheckpointOptions sets both policy and context_fn; a selective policy "
          "is itself a context_fn, so set only one of them");
    }
  }
  std::shared_ptr<RegionContexts> contexts(const CheckpointOptions& options) const override {
    if (!options.policy()) return nullptr;
    return create_selective_checkpoint_contexts(
        *options.policy(), /*allow_cache_entry_mutation=*/false, options.swap_manager());
  }
};

}  // namespace

void register_selective_plugin() { add_region_plugin(std::make_shared<SelectivePlugin>()); }

}  // namespace recompose::detail
