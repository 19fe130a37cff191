#include "engine/region_events.h"

#include "engine/checkpoint_depth.h"
#include "engine/meter_charge.h"
#include "engine/region_forward_policy.h"
#include "engine/saved_tensor_policy.h"

#include <recompose/checkpoint_options.h>

namespace recompose::detail {

events::RegionBegun region_begun_event(const CheckpointOptions& options,
                                       const torch::nn::Module* owner) {
  events::RegionBegun event;
  event.kind = options.context_fn() ? events::RegionKind::CustomContexts
               : options.policy()   ? events::RegionKind::Selective
                                    : events::RegionKind::Full;
  event.swap_inputs = options.swap_inputs();
  event.module = owner;
  if (!options.state_modules().empty()) event.state_modules = &options.state_modules();
  event.in_recomputation = CheckpointDepth::recompute() != 0;
  return event;
}

events::InputsSaved how_inputs_are_saved() {
  // The innermost policy saves the inputs (See Note [ Nestable Checkpoint ], rule 2).
  const SavedTensorPolicy* innermost = nullptr;
  for_each_policy([&](SavedTensorPolicy& policy) {
    if (innermost == nullptr) innermost = &policy;
  });
  if (innermost == nullptr || is_meter_policy(*innermost)) return events::InputsSaved::Held;
  if (dynamic_cast<const RegionForwardPolicy*>(innermost) != nullptr)
    return events::InputsSaved::Enclosing;
  return events::InputsSaved::Outer;
}

}  // namespace recompose::detail
