// The optimizer both the sharded run (over shards) and the reference (over full parameters) use:
// both optimizers are elementwise, so updating shards equals updating the whole.
#pragma once

#include "options.h"

#include <torch/torch.h>

#include <memory>

namespace sharded {

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o,
                                                               std::vector<torch::Tensor> params) {
  if (o.optim == "adam") {
    return std::make_unique<torch::optim::Adam>(std::move(params),
                                                torch::optim::AdamOptions(o.lr * 0.02));
  }
  return std::make_unique<torch::optim::SGD>(std::move(params),
                                             torch::optim::SGDOptions(o.lr).momentum(0.9));
}

}  // namespace sharded
