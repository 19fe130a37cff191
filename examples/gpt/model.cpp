#include "model.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpt {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const Config& config)
    : heads(config.heads), attn_dropout(config.dropout) {
  qkv = register_module("qkv", torch::nn::Linear(config.width, 3 * config.width));
  proj = register_module("proj", torch::nn::Linear(config.width, config.width));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  // [B, T, 3C] -> three [B, heads, T, C / heads] views.
  auto split =
      qkv(x).view({batch, time, 3, heads, width / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
  // Fused kernel where the build has one (flash attention on CPU and CUDA); LibTorch falls back
  // to matmul + softmax itself when it cannot use it (e.g. with attention dropout on CPU).
  auto y = torch::scaled_dot_product_attention(split[0], split[1], split[2], /*attn_mask=*/{},
                                               /*dropout_p=*/is_training() ? attn_dropout : 0.0,
                                               /*is_causal=*/true);
  y = y.transpose(1, 2).reshape({batch, time, width});
  return resid_dropout(proj(y));
}

MLPImpl::MLPImpl(const Config& config) {
  fc = register_module("fc", torch::nn::Linear(config.width, 4 * config.width));
  proj = register_module("proj", torch::nn::Linear(4 * config.width, config.width));
  dropout = register_module("dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return dropout(proj(torch::gelu(fc(x)))); }

BlockImpl::BlockImpl(const Config& config) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));
  mlp = register_module("mlp", MLP(config));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  RECOMPOSE_FORWARD(x);  // makes this block checkpointable by recompose::apply_checkpoint
  x = x + attn(ln1(x));
  return x + mlp(ln2(x));
}

GPTImpl::GPTImpl(const Config& cfg) : config(cfg) {
  if (config.vocab_size <= 0) throw std::invalid_argument("GPT: vocab_size must be positive");
  if (config.width % config.heads != 0) {
    throw std::invalid_argument("GPT: width " + std::to_string(config.width) +
                                " is not divisible by heads " + std::to_string(config.heads));
  }
  token_embedding =
      register_module("token_embedding", torch::nn::Embedding(config.vocab_size, config.width));
  position_embedding =
      register_module("position_embedding", torch::nn::Embedding(config.context, config.width));
  embedding_dropout = register_module("embedding_dropout", torch::nn::Dropout(config.dropout));
  block_list = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) {
    blocks.emplace_back(config);
    block_list->push_back(blocks.back());
  }
  ln_final = register_module("ln_final",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));

  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, and residual projections scaled down
  // by depth so that the residual stream does not grow with the number of blocks.
  torch::NoGradGuard no_grad;
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (name.ends_with(".bias")) {
      p.zero_();
    } else if (name.find(".ln") != std::string::npos || name.starts_with("ln_final")) {
      p.fill_(1.0);  // LayerNorm weights
    } else if (name.ends_with("proj.weight")) {
      p.normal_(0.0, resid_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const int64_t time = tokens.size(1);
  if (time > config.context) {
    throw std::invalid_argument("GPT: sequence of " + std::to_string(time) +
                                " tokens is longer than the context " +
                                std::to_string(config.context));
  }
  auto positions = torch::arange(time, tokens.options());
  auto x = embedding_dropout(token_embedding(tokens) + position_embedding(positions));
  for (auto& block : blocks) x = block(x);
  // The output head shares the token embedding's weight (weight tying): no separate parameter.
  return torch::linear(ln_final(x), token_embedding->weight);
}

int64_t GPTImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace gpt
