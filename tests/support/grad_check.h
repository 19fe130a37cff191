// Helpers to compare gradients of a computation with and without checkpointing.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace rt {

// Runs loss_fn (which must build a scalar loss from `inputs`), backpropagates, and returns the
// gradients of `inputs`, which are cleared first.
inline std::vector<torch::Tensor> grads_of(const std::function<torch::Tensor()>& loss_fn,
                                           const std::vector<torch::Tensor>& inputs) {
  for (auto t : inputs) {
    if (t.grad().defined()) t.mutable_grad() = torch::Tensor();
  }
  loss_fn().backward();
  std::vector<torch::Tensor> out;
  for (const auto& t : inputs)
    out.push_back(t.grad().defined() ? t.grad().clone() : torch::Tensor());
  return out;
}

inline bool bitwise_equal(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

inline std::vector<torch::Tensor> params_of(torch::nn::Module& m) { return m.parameters(); }

}  // namespace rt
