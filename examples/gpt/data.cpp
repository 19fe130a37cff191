#include "data.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpt {

CharDataset::CharDataset(const std::filesystem::path& path, int64_t context,
                         double validation_fraction)
    : context_(context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read the training text '" + path.string() +
                             "' (pass another one with --data FILE)");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  text_ = buffer.str();

  std::array<bool, 256> seen{};
  for (unsigned char c : text_) seen[c] = true;
  index_.fill(-1);
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) {
      index_[c] = static_cast<int64_t>(alphabet_.size());
      alphabet_.push_back(static_cast<char>(c));
    }
  }
  auto all = encode(text_);
  const auto n = all.numel();
  const auto n_validation = static_cast<int64_t>(static_cast<double>(n) * validation_fraction);
  train_ = all.slice(0, 0, n - n_validation);
  validation_ = all.slice(0, n - n_validation);
  if (std::min(train_.numel(), validation_.numel()) <= context_ + 1) {
    throw std::runtime_error("the training text '" + path.string() + "' (" + std::to_string(n) +
                             " characters) is too short for a context of " +
                             std::to_string(context_));
  }
}

std::pair<torch::Tensor, torch::Tensor> CharDataset::batch(int64_t batch, bool validation,
                                                           at::Generator& generator,
                                                           const torch::Device& device) const {
  const auto& source = validation ? validation_ : train_;
  auto starts = torch::randint(source.numel() - context_ - 1, {batch, 1}, generator, torch::kLong);
  auto index = starts + torch::arange(context_ + 1, torch::kLong);  // [batch, context + 1]
  auto windows = source.index({index});
  return {windows.slice(1, 0, context_).to(device), windows.slice(1, 1).to(device)};
}

torch::Tensor CharDataset::encode(const std::string& s) const {
  auto out = torch::empty({static_cast<int64_t>(s.size())}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (unsigned char c : s) {
    if (index_[c] < 0)
      throw std::invalid_argument(std::string("character not in the vocabulary: ") + char(c));
    *p++ = index_[c];
  }
  return out;
}

bool CharDataset::can_encode(const std::string& s) const {
  return std::all_of(s.begin(), s.end(), [&](unsigned char c) { return index_[c] >= 0; });
}

std::string CharDataset::decode(const torch::Tensor& tokens) const {
  auto cpu = tokens.to(torch::kCPU, torch::kLong).contiguous();
  std::string s;
  s.reserve(static_cast<size_t>(cpu.numel()));
  const auto* p = cpu.data_ptr<int64_t>();
  for (int64_t i = 0; i < cpu.numel(); ++i) s.push_back(alphabet_.at(static_cast<size_t>(p[i])));
  return s;
}

}  // namespace gpt
