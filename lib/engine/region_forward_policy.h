// The saved-tensor policy active during a checkpointed region's forward: every tensor saved
// there becomes a Holder of the region's Frame (recomputed at backward).
#pragma once

#include "engine/frame.h"
#include "engine/saved_tensor_policy.h"

#include <memory>

namespace recompose::detail {

class RegionForwardPolicy final : public SavedTensorPolicy {
 public:
  explicit RegionForwardPolicy(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override;

 private:
  std::shared_ptr<Frame> frame_;
};

}  // namespace recompose::detail
