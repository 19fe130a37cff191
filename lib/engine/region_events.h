// What the region protocol tells the sinks of events (events/events.h) about a region: what
// begins, and how the saved-tensor stack keeps its inputs.
#pragma once

#include "events/events.h"

namespace torch::nn {
class Module;
}

namespace recompose {
struct CheckpointOptions;
}

namespace recompose::detail {

// The event of a region beginning under `options` (`owner`: its module, null for checkpoint(fn)).
events::RegionBegun region_begun_event(const CheckpointOptions& options,
                                       const torch::nn::Module* owner);

// How the saved-tensor stack of this thread would save a region's inputs now.
events::InputsSaved how_inputs_are_saved();

}  // namespace recompose::detail
