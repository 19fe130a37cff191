// Character-level text data: the vocabulary is the set of bytes that occur in the text, and a
// batch is `batch` random windows of `context + 1` characters (inputs and next-character targets).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace gpt {

class CharDataset {
 public:
  // Throws std::runtime_error with the path when the file is missing, unreadable or too short.
  CharDataset(const std::filesystem::path& path, int64_t context, double validation_fraction = 0.1);

  int64_t vocab_size() const { return static_cast<int64_t>(alphabet_.size()); }
  int64_t train_size() const { return train_.numel(); }
  const std::string& text() const { return text_; }

  // Inputs and targets, [batch, context] int64 each, on `device`. Sampling uses its own
  // generator, so the data a step sees does not depend on how much randomness the model drew.
  std::pair<torch::Tensor, torch::Tensor> batch(int64_t batch, bool validation,
                                                at::Generator& generator,
                                                const torch::Device& device) const;

  std::string decode(const torch::Tensor& tokens) const;
  torch::Tensor encode(const std::string& s) const;  // throws on a character not in the text
  bool can_encode(const std::string& s) const;

 private:
  std::string text_;
  std::string alphabet_;              // token id -> byte
  std::array<int64_t, 256> index_{};  // byte -> token id, -1 when not in the text
  torch::Tensor train_, validation_;  // token ids, int64
  int64_t context_;
};

}  // namespace gpt
