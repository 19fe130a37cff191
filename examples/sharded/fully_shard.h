// FSDP-like sharding of a module's units with forward hooks (FSDP2's fully_shard, by hand).
//
// Each unit (a block whose forward carries RECOMPOSE_FORWARD) gets a FlatShard and:
//  - a pre-forward hook: unshard (all-gather), unless the parameters are already there;
//  - a post-forward hook: reshard (free the full parameters), except while the block is being
//    recomputed by apply_checkpoint in backward: its backward is about to need them;
//  - after the forward of a block that is not checkpointed, a hook on its output that unshards
//    before the block's backward runs (a checkpointed block is unsharded by its recomputation,
//    which runs before any of its backward nodes reads a parameter);
//  - post-accumulate-grad hooks on its parameters: when all of them have their gradient, the
//    gradients are reduce-scattered to the owning ranks and the unit is resharded.
// The hooks compose with apply_checkpoint's on the same module, registered in either order.
#pragma once

#include "collective_counts.h"
#include "flat_shard.h"

#include <recompose/hooks/forward_hooks.h>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace sharded {

inline constexpr const char* kHookOwner = "sharded";

class FullyShard {
 public:
  FullyShard(c10d::Backend& pg, CollectiveCounts& counts) : pg_(pg), counts_(counts) {}
  // Removes every hook this object registered. The units' parameters keep their (resharded,
  // empty) storage: call unshard_all() first if the model is used afterwards.
  ~FullyShard();
  FullyShard(const FullyShard&) = delete;
  FullyShard& operator=(const FullyShard&) = delete;

  // Shards every parameter of `unit` (recursively) and hooks its forward. Throws
  // std::invalid_argument if the unit's forward is not annotated or a parameter is already in
  // another unit.
  void add_unit(torch::nn::Module& unit, const std::string& name);

  // The optimizer's parameters: one shard per unit.
  std::vector<torch::Tensor> shards() const;
  const std::vector<std::shared_ptr<FlatShard>>& units() const { return flats_; }

  // After a step's backward: throws std::runtime_error naming the unit if a unit is still
  // unsharded, missed gradients, or issued other collectives than one all-gather in forward,
  // one in its backward (from recomputation when checkpointed, else from the output hook) and one
  // reduce-scatter. Then starts counting the next step.
  void verify_step();

  // Gathers every unit's full parameters (to read or save the whole model), and frees them again.
  void unshard_all();
  void reshard_all();

 private:
  struct Unit {
    std::weak_ptr<torch::nn::Module> module;
    std::shared_ptr<FlatShard> flat;
    std::vector<recompose::hooks::HookHandle> hooks;
  };
  c10d::Backend& pg_;
  CollectiveCounts& counts_;
  std::vector<Unit> units_;
  std::vector<std::shared_ptr<FlatShard>> flats_;
};

}  // namespace sharded
