#include "fused_adamw.h"

namespace gpt {
namespace {

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, double beta1, double beta2,
                       double weight_decay, double eps)
    : params_(std::move(params)),
      beta1_(beta1),
      beta2_(beta2),
      weight_decay_(weight_decay),
      eps_(eps) {
  torch::NoGradGuard no_grad;
  for (const auto& p : params_) {
    exp_avgs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    exp_avg_sqs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    // Float step counters on the parameter's device, as torch.optim keeps them for fused=True.
    steps_.push_back(torch::zeros({}, p.options().dtype(torch::kFloat32)));
  }
}

void FusedAdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    params.push_back(params_[i]);
    grads.push_back(params_[i].grad());
    exp_avgs.push_back(exp_avgs_[i]);
    exp_avg_sqs.push_back(exp_avg_sqs_[i]);
    steps.push_back(steps_[i]);
  }
  if (params.empty()) return;
  at::_foreach_add_(steps, 1);  // the kernel reads the step count after this update's increment
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1_,
                    beta2_, weight_decay_, eps_, /*amsgrad=*/false, /*maximize=*/false);
}

void FusedAdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

void clip_grad_norm_foreach(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  auto grads = grads_of(params);
  if (grads.empty()) return;
  const auto total = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2.0)), 2.0);
  const auto coefficient =
      torch::clamp(max_norm / (total + 1e-6), /*min=*/std::nullopt, /*max=*/1.0);
  at::_foreach_mul_(grads, coefficient);
}

}  // namespace gpt
