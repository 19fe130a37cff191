// Activation swap as a region plug-in (CheckpointOptions::swap_inputs offloads a top-level
// region's inputs) and as the Offloader of plugin/offload.h (selective checkpointing's MUST_SWAP).
#include "engine/checkpoint_depth.h"
#include "engine/region_plugin.h"
#include "plugin/offload.h"
#include "swap/input_swap.h"

#include <recompose/swap.h>

namespace recompose::detail {
namespace {

class SwapInputsPlugin final : public RegionPlugin {
 public:
  const char* name() const override { return "activation swap"; }
  std::unique_ptr<SavedTensorPolicyScope> input_policy(
      const CheckpointOptions& options) const override {
    // Only a top-level region's inputs are really held: an enclosing region already replaces a
    // nested region's inputs by placeholders, and a recomputation's are transient.
    if (CheckpointDepth::forward() > 0 || CheckpointDepth::recompute() > 0) return nullptr;
    return input_swap_scope(options);
  }
};

class Swapped final : public OffloadedTensor {
 public:
  explicit Swapped(std::shared_ptr<SwappedTensor> t) : t_(std::move(t)) {}
  at::Tensor get() override { return t_->get(); }

 private:
  std::shared_ptr<SwappedTensor> t_;
};

class SwapOffloader final : public Offloader {
 public:
  explicit SwapOffloader(std::shared_ptr<SwapManager> m) : manager_(std::move(m)) {}
  bool eligible(const at::Tensor& tensor) const override { return manager_->eligible(tensor); }
  std::shared_ptr<OffloadedTensor> offload(const at::Tensor& tensor) override {
    return std::make_shared<Swapped>(manager_->offload(tensor));
  }
  void synchronize() override { manager_->synchronize(); }

 private:
  std::shared_ptr<SwapManager> manager_;
};

std::shared_ptr<Offloader> make_swap_offloader(std::shared_ptr<SwapManager> manager) {
  return std::make_shared<SwapOffloader>(manager ? std::move(manager)
                                                 : SwapManager::default_manager());
}

}  // namespace

void register_swap_plugin() {
  add_region_plugin(std::make_shared<SwapInputsPlugin>());
  set_offloader_factory(&make_swap_offloader);
}

}  // namespace recompose::detail
