#include "engine/region_forward_policy.h"

namespace recompose::detail {
namespace {

// Hooks of one tensor saved during a region's forward: the Holder stands in for the tensor.
class RegionHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit RegionHooks(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const at::Tensor& tensor) override { holder_ = frame_->record_saved(tensor); }
  at::Tensor call_unpack_hook() override { return frame_->unpack(*holder_); }

 private:
  std::shared_ptr<Frame> frame_;
  std::shared_ptr<Holder> holder_;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> RegionForwardPolicy::make_hooks() {
  return std::make_unique<RegionHooks>(frame_);
}

}  // namespace recompose::detail
