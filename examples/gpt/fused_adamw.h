// AdamW and gradient clipping as PyTorch's Python runs them on CUDA: one fused kernel for the
// update of every parameter (torch.optim.AdamW(fused=True)) and multi-tensor norms for clipping
// (torch.nn.utils.clip_grad_norm_'s foreach path), with no host synchronisation.
//
// LibTorch's torch::optim::AdamW and torch::nn::utils::clip_grad_norm_ launch a dozen kernels per
// parameter and read the norm back to the host: on a 150M-parameter GPT that is ~20% of a step on
// an H100, which would be charged to the model, not to checkpointing. The gpt example uses these
// on CUDA (and LibTorch's own on CPU, where the kernels are the same loops).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace gpt {

class FusedAdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, double beta1, double beta2, double weight_decay,
             double eps = 1e-8);
  // One update of every parameter that has a gradient, at learning rate `lr`.
  void step(double lr);
  // Drops the gradients (set to none, as zero_grad does by default).
  void zero_grad();

 private:
  std::vector<torch::Tensor> params_, exp_avgs_, exp_avg_sqs_, steps_;
  double beta1_, beta2_, weight_decay_, eps_;
};

// Scales the gradients so that their global 2-norm is at most `max_norm` (clip_grad_norm_),
// without reading the norm back to the host.
void clip_grad_norm_foreach(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gpt
