// The model the example trains: residual pre-norm MLP blocks and a head, each an annotated unit.
#pragma once

#include <recompose/hooks/forward_annotation.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <utility>

namespace sharded {

// x + fc2(gelu(fc1(norm(x)))): one sharding unit, and the unit apply_checkpoint wraps.
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t width, int64_t hidden)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, width))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return x + fc2->forward(torch::gelu(fc1->forward(norm->forward(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(MlpBlock);

// Final norm and projection: a unit too (sharded, not checkpointed).
struct HeadImpl : torch::nn::Module {
  HeadImpl(int64_t width, int64_t out)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        proj(register_module("proj", torch::nn::Linear(width, out))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return proj->forward(norm->forward(x));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear proj;
};
TORCH_MODULE(Head);

struct ModelConfig {
  int blocks = 4;
  int64_t width = 64, hidden = 256, out = 8;
};

struct MlpModelImpl : torch::nn::Module {
  explicit MlpModelImpl(const ModelConfig& c)
      : blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", Head(c.width, c.out))) {
    for (int i = 0; i < c.blocks; ++i) blocks->push_back(MlpBlock(c.width, c.hidden));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& b : *blocks) x = b->as<MlpBlockImpl>()->forward(x);
    return head->forward(x);
  }
  torch::nn::ModuleList blocks;
  Head head;
};
TORCH_MODULE(MlpModel);

// The same model on every rank and in the reference: initialised from `seed`.
inline MlpModel make_model(const ModelConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  return MlpModel(c);
}

// Rank `rank`'s batch for `step`: its own seed, so the union over ranks is known to every rank.
inline std::pair<torch::Tensor, torch::Tensor> make_batch(uint64_t seed, int rank, int step,
                                                          int64_t batch, const ModelConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + uint64_t(step) * 1009 +
                                                      uint64_t(rank) + 1);
  auto x = torch::randn({batch, c.width}, gen, torch::kFloat);
  auto y = torch::tanh(x.narrow(1, 0, c.out) * 2) +
           0.1 * torch::randn({batch, c.out}, gen, torch::kFloat);
  return {x, y};
}

}  // namespace sharded
