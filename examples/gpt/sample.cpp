#include "sample.h"

#include <algorithm>

namespace gpt {

std::string sample(GPT& model, const CharDataset& data, const std::string& prompt, int64_t length,
                   uint64_t seed, const torch::Device& device) {
  torch::NoGradGuard no_grad;  // no autograd graph, so checkpointing stays out of the way
  model->eval();
  auto generator = at::detail::createCPUGenerator(seed);
  auto tokens = data.encode(prompt).unsqueeze(0).to(device);
  for (int64_t i = 0; i < length; ++i) {
    auto window = tokens.slice(1, std::max<int64_t>(tokens.size(1) - model->config.context, 0));
    auto logits = model(window).select(1, -1).to(torch::kCPU);
    auto next = torch::multinomial(torch::softmax(logits, -1), 1, /*replacement=*/false, generator);
    tokens = torch::cat({tokens, next.to(device)}, 1);
  }
  model->train();
  return data.decode(tokens.squeeze(0));
}

}  // namespace gpt
