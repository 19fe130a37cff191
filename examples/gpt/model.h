// A decoder-only transformer (GPT) written with LibTorch's C++ modules. Nothing in it knows
// about checkpointing except the one-line RECOMPOSE_FORWARD annotation on Block::forward, which
// lets the training program attach recompose::apply_checkpoint to each block from outside.
#pragma once

#include <recompose/hooks/forward_annotation.h>

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace gpt {

struct Config {
  int64_t vocab_size = 0;
  int64_t context = 64;  // longest sequence the position embedding covers
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  double dropout = 0.1;
};

// Multi-head causal self-attention with one fused Linear for queries, keys and values.
struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
  int64_t heads;
  double attn_dropout;
};
TORCH_MODULE(CausalSelfAttention);

// Position-wise feed-forward: width -> 4 * width -> width with GELU.
struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

// One pre-LayerNorm transformer block: the unit that gets checkpointed.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Config& config);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const Config& config);
  // tokens: [batch, time] int64, time <= context. Returns logits [batch, time, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  int64_t parameter_count() const;

  Config config;
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
  torch::nn::Dropout embedding_dropout{nullptr};
  torch::nn::ModuleList block_list{
      nullptr};               // registered as "blocks": names blocks.0.attn.qkv.weight, ...
  std::vector<Block> blocks;  // the same modules, typed
  torch::nn::LayerNorm ln_final{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace gpt
