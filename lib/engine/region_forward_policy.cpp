#include "engine/region_forward_policy.h"

namespace recompose::detail {
namespace {

// Hooks of one tensor saved during a region's forward: a Holder of the frame stands in for the
// tensor while the SavedVariable that owns these hooks lives.
class RegionHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit RegionHooks(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  ~RegionHooks() override {
    if (index_ != kUnset) frame_->release_saved(index_);
  }
  void call_pack_hook(const at::Tensor& tensor) override { index_ = frame_->record_saved(tensor); }
  at::Tensor call_unpack_hook() override { return frame_->unpack(index_); }

 private:
  static constexpr std::size_t kUnset = static_cast<std::size_t>(-1);
  std::shared_ptr<Frame> frame_;
  std::size_t index_ = kUnset;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> RegionForwardPolicy::make_hooks() {
  return std::make_unique<RegionHooks>(frame_);
}

}  // namespace recompose::detail
