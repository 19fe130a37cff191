// A program outside recompose, built against an installed recompose (pkg-config, CMake) or with
// recompose as a Meson subproject: an annotated module, apply_checkpoint, one backward, and a
// check that the gradients equal those of the same module without checkpointing and that the
// forward was run again during backward. Exit 0 when all holds.
#include <recompose/recompose.h>

#include <torch/torch.h>

#include <cstdio>

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 16));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);  // makes this forward hookable
    ++forward_runs;
    if (recompose::is_recomputing()) ++recomputations;
    return x + fc2(torch::gelu(fc1(ln(x))));
  }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  int forward_runs = 0, recomputations = 0;
};
TORCH_MODULE(Block);

std::vector<torch::Tensor> gradients(Block& block, const torch::Tensor& x) {
  block->zero_grad();
  block(block(x)).square().mean().backward();  // the block twice: two regions
  std::vector<torch::Tensor> grads;
  for (const auto& p : block->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

int main() {
  torch::manual_seed(0);
  Block block;
  const torch::Tensor x = torch::randn({4, 8, 16});

  const auto expected = gradients(block, x);
  recompose::apply_checkpoint(block);
  block->forward_runs = block->recomputations = 0;
  const auto got = gradients(block, x);

  int failures = 0;
  if (!recompose::is_checkpointed(block)) {
    std::printf("FAIL: is_checkpointed is false after apply_checkpoint\n");
    ++failures;
  }
  if (block->recomputations != 2 || block->forward_runs != 4) {
    std::printf("FAIL: expected 2 forwards and 2 recomputations, got %d runs, %d recomputations\n",
                block->forward_runs, block->recomputations);
    ++failures;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!torch::equal(expected[i], got[i])) {
      std::printf("FAIL: gradient %zu differs with checkpointing (max abs diff %g)\n", i,
                  (expected[i] - got[i]).abs().max().item<double>());
      ++failures;
    }
  }
  std::printf("consumer: %zu gradients, %d forward runs (%d in recomputation), %s\n",
              expected.size(), block->forward_runs, block->recomputations,
              failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
