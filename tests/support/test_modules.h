// Small annotated modules shared by the test suites.
#pragma once

#include <recompose/hooks/forward_annotation.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <atomic>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace rt {

enum class Mode { Add, Mul };

// Linear + tanh: the smallest block with parameters and saved activations.
struct TinyBlockImpl : torch::nn::Module {
  explicit TinyBlockImpl(int64_t width = 4) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    register_buffer("running", torch::zeros({width}));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    ++body_runs;
    return torch::tanh(fc->forward(x));
  }
  torch::nn::Linear fc{nullptr};
  std::atomic<int> body_runs{0};  // atomic: the threaded tests run one block on several threads
};
TORCH_MODULE(TinyBlock);

// Linear (in -> out) + tanh: a block whose saved activations have the sizes a test picks.
struct TanhLinearImpl : torch::nn::Module {
  TanhLinearImpl(int64_t in, int64_t out)
      : linear(register_module("linear", torch::nn::Linear(in, out))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::tanh(linear(x));
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(TanhLinear);

// TanhLinear blocks from widths[0] to widths.back() ({16, 64, 64, 16}: three blocks), each a
// region the ledger's, its Chrome trace's and the memory snapshot's tests checkpoint or offload.
struct TanhStackImpl : torch::nn::Module {
  explicit TanhStackImpl(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      blocks->push_back(TanhLinear(widths[i], widths[i + 1]));
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : *blocks) x = b->as<TanhLinearImpl>()->forward(x);
    return x;
  }
  torch::nn::Module& block(size_t i) { return *(*blocks)[i]; }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(TanhStack);

// Every supported argument kind at once.
struct MixedArgsImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, std::optional<torch::Tensor> bias,
                        std::vector<torch::Tensor> extra, std::tuple<torch::Tensor, double> scaled,
                        std::pair<int64_t, std::string> tag, Mode mode) {
    RECOMPOSE_FORWARD(x, bias, extra, scaled, tag, mode);
    last_tag = tag.second;
    torch::Tensor y = mode == Mode::Add ? x + std::get<0>(scaled) * std::get<1>(scaled)
                                        : x * std::get<0>(scaled) * std::get<1>(scaled);
    if (bias) y = y + *bias;
    for (const auto& e : extra) y = y + e;
    return y * static_cast<double>(tag.first);
  }
  std::string last_tag;
};
TORCH_MODULE(MixedArgs);

// Throws from its body when asked to.
struct ThrowingImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x, bool fail) {
    RECOMPOSE_FORWARD(x, fail);
    if (fail) throw std::runtime_error("body failed");
    return x * 2;
  }
};
TORCH_MODULE(Throwing);

// Two annotated blocks inside an annotated parent.
struct NestedImpl : torch::nn::Module {
  NestedImpl() {
    a = register_module("a", TinyBlock(4));
    b = register_module("b", TinyBlock(4));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return b(a(x));
  }
  TinyBlock a{nullptr}, b{nullptr};
};
TORCH_MODULE(Nested);

// Returns a tuple (two outputs).
struct TwoOutImpl : torch::nn::Module {
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return {x.sin(), x.cos()};
  }
};
TORCH_MODULE(TwoOut);

// Not annotated: hooks cannot attach.
struct PlainImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x + 1; }
};
TORCH_MODULE(Plain);

}  // namespace rt
