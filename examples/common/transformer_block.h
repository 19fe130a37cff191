// A pre-LayerNorm transformer block (attention + MLP) for the benchmarks, with the one-line
// annotation that makes it checkpointable.
#pragma once

#include <recompose/hooks/forward_annotation.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

namespace examples {

struct TransformerBlockImpl : torch::nn::Module {
  TransformerBlockImpl(int64_t width, int64_t heads) : heads_(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    qkv = register_module("qkv", torch::nn::Linear(width, 3 * width));
    proj = register_module("proj", torch::nn::Linear(width, width));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc1 = register_module("fc1", torch::nn::Linear(width, 4 * width));
    fc2 = register_module("fc2", torch::nn::Linear(4 * width, width));
  }

  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads_;
    auto parts = qkv(ln1(x)).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
    auto att =
        torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(mask, -INFINITY).softmax(-1);
    auto y = torch::matmul(att, parts[2]).transpose(1, 2).reshape({b, t, c});
    x = x + proj(y);
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }

  int64_t heads_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TransformerBlock);

}  // namespace examples
