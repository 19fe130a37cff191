// The parameters of one sharding unit (a block) flattened into one buffer, of which this rank
// owns 1/world (FSDP's FlatParameter, with FSDP2's storage-resize trick).
//
// The unit's parameters stay the module's own leaf tensors (names, hooks, state_dict unchanged),
// but set_data makes each a view into `full`, a flat buffer padded to world * shard_numel.
// Resharding frees full's storage (resized to 0 bytes) without touching the views; unsharding
// re-allocates it and all-gathers every rank's shard into it, so the views, and the copies of
// them that autograd saved for backward, see the full values again.
#pragma once

#include "collective_counts.h"

#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace sharded {

class FlatShard {
 public:
  // Takes over `params` (all float32, on one device: the CPU or a GPU): copies their values into
  // the flat buffer, which every rank fills identically (same init), keeps this rank's piece, and
  // reshards. Buffers, shard and gradients stay on that device.
  FlatShard(c10d::Backend& pg, std::string name, std::vector<torch::Tensor> params,
            CollectiveCounts& counts);
  FlatShard(const FlatShard&) = delete;
  FlatShard& operator=(const FlatShard&) = delete;

  const std::string& name() const { return name_; }
  bool is_unsharded() const;
  // All-gathers the full parameters unless they are already there. Returns whether it gathered.
  bool unshard(Phase phase);
  void reshard();

  // Called once per parameter when its gradient has been accumulated in backward. When the last
  // one of the unit arrives: reduce-scatters (average over ranks) the unit's gradients into the
  // shard's grad, drops the full gradients, and reshards.
  void on_grad_ready();
  int grads_pending() const { return grads_ready_; }

  // This rank's piece of the parameters: the leaf that the optimizer updates; .grad() holds the
  // reduced gradient.
  const torch::Tensor& shard() const { return shard_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  int64_t numel() const { return numel_; }

  // Collectives of this unit since reset_step_counts(), to check "one all-gather per phase".
  const std::array<int, kPhases>& step_gathers() const { return step_gathers_; }
  int step_scatters() const { return step_scatters_; }
  void reset_step_counts();

 private:
  c10d::Backend& pg_;
  std::string name_;
  std::vector<torch::Tensor> params_;
  CollectiveCounts& counts_;
  torch::Device device_ = torch::kCPU;
  int rank_ = 0, world_ = 1;
  int64_t numel_ = 0, shard_numel_ = 0;
  torch::Tensor full_;   // world * shard_numel_ elements; storage empty while sharded
  torch::Tensor shard_;  // shard_numel_ elements, owned
  int grads_ready_ = 0;
  std::array<int, kPhases> step_gathers_{};
  int step_scatters_ = 0;
};

}  // namespace sharded
