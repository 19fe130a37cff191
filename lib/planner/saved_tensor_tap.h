// The contexts of a region the profiler intercepts: selective checkpointing's own, passed every
// call, and each tensor autograd saves in the region handed to a callback first (the profiler
// matches it to the op that made it: the ops a selective replay must run start there).
#pragma once

#include "engine/saved_tensor_replay.h"

#include <recompose/region_contexts.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace recompose::detail {

class SavedTensorTap final : public RegionContexts, public SavedTensorReplay {
 public:
  using OnSaved = std::function<void(const at::Tensor&)>;
  // `inner` must replay (selective contexts do); `on_saved` runs on the forward's thread.
  SavedTensorTap(std::shared_ptr<RegionContexts> inner, OnSaved on_saved)
      : inner_(std::move(inner)),
        replay_(dynamic_cast<SavedTensorReplay*>(inner_.get())),
        on_saved_(std::move(on_saved)) {}

  std::shared_ptr<void> enter_forward() override { return inner_->enter_forward(); }
  std::shared_ptr<void> enter_recompute() override { return inner_->enter_recompute(); }

  void region_inputs(const std::vector<at::Tensor>& inputs) override {
    if (replay_ != nullptr) replay_->region_inputs(inputs);
  }
  void saved(std::size_t index, const at::Tensor& tensor) override {
    on_saved_(tensor);
    if (replay_ != nullptr) replay_->saved(index, tensor);
  }
  bool replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
              const std::vector<bool>& needed, std::vector<at::Tensor>& out) override {
    return replay_ != nullptr && replay_->replay(inputs, rng_preserved, needed, out);
  }
  void not_replayed(const char* why) override {
    if (replay_ != nullptr) replay_->not_replayed(why);
  }

 private:
  std::shared_ptr<RegionContexts> inner_;
  SavedTensorReplay* replay_;
  OnSaved on_saved_;
};

}  // namespace recompose::detail
