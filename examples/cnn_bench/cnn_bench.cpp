// Step time and bytes held for backward of a stack of ResNet basic blocks (conv, BatchNorm, ReLU,
// conv, BatchNorm, residual add) in training, side by side: no checkpointing, full checkpointing
// of every block, and selective checkpointing keeping the convolutions, with the selective replay
// on and off. Before native_batch_norm could be replayed (issue 31, item 10), every such region
// fell back to running its forward again: "replay off" is that step.
//
//   ./build/examples/cnn_bench/cnn_bench [--device auto|cpu|cuda] [--blocks 6] [--channels 32]
//       [--size 32] [--batch 8] [--reps 9] [--threads 0]
#include "../common/device.h"

#include <recompose/recompose.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t blocks = 6, channels = 32, size = 32, batch = 8, reps = 9, threads = 0;
  std::string device = "auto";
};

const char* kUsage =
    "usage: cnn_bench [--device auto|cpu|cuda] [--blocks 6] [--channels 32] [--size 32] "
    "[--batch 8] [--reps 9] [--threads 0]";

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    if (flag == "--device") {
      c.device = value;
      continue;
    }
    const int64_t v = examples::int_flag(flag, value);
    if (v < (flag == "--threads" ? 0 : 1))
      throw std::invalid_argument(flag + " must be positive, got " + value);
    if (flag == "--blocks")
      c.blocks = v;
    else if (flag == "--channels")
      c.channels = v;
    else if (flag == "--size")
      c.size = v;
    else if (flag == "--batch")
      c.batch = v;
    else if (flag == "--reps")
      c.reps = v;
    else if (flag == "--threads")
      c.threads = v;
    else
      throw std::invalid_argument("unknown flag " + flag + "\n" + kUsage);
  }
  return c;
}

struct BasicBlockImpl : torch::nn::Module {
  explicit BasicBlockImpl(int64_t c) {
    auto conv = [c] { return torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false); };
    conv1 = register_module("conv1", torch::nn::Conv2d(conv()));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(c));
    conv2 = register_module("conv2", torch::nn::Conv2d(conv()));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(c));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::relu(x + bn2(conv2(torch::relu(bn1(conv1(x))))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(BasicBlock);

enum class Mode { None, Full, SelectiveReplay, SelectiveRerun };
const char* name_of(Mode m) {
  switch (m) {
    case Mode::None:
      return "none";
    case Mode::Full:
      return "full";
    case Mode::SelectiveReplay:
      return "selective, replayed";
    case Mode::SelectiveRerun:
      return "selective, run again (before)";
  }
  return "?";
}

struct Setup {
  Mode mode;
  torch::nn::Sequential net;
  std::vector<double> seconds;
  int64_t held = 0;
  int64_t replayed = 0, fallbacks = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  const Config c = parse(argc, argv);
  if (c.threads > 0) torch::set_num_threads(static_cast<int>(c.threads));
  const torch::Device device = examples::pick_device(c.device);
  const std::vector<Mode> modes = {Mode::None, Mode::Full, Mode::SelectiveReplay,
                                   Mode::SelectiveRerun};
  std::vector<Setup> setups;
  for (Mode mode : modes) {
    torch::manual_seed(0);  // the same weights for every mode
    torch::nn::Sequential net;
    for (int64_t b = 0; b < c.blocks; ++b) net->push_back(BasicBlock(c.channels));
    net->to(device);
    for (auto& child : net->children()) {
      if (mode == Mode::Full) recompose::apply_checkpoint(*child);
      if (mode == Mode::SelectiveReplay || mode == Mode::SelectiveRerun) {
        recompose::apply_checkpoint(*child, recompose::CheckpointOptions().policy(
                                                recompose::SelectivePolicy({"aten::convolution"})));
      }
    }
    setups.push_back({mode, net, {}, 0, 0, 0});
  }
  torch::manual_seed(1);
  const auto x =
      torch::randn({c.batch, c.channels, c.size, c.size}, torch::TensorOptions().device(device));
  // Round r runs every mode once, starting one further each round (this machine's speed drifts).
  for (int64_t r = 0; r <= c.reps; ++r) {
    for (size_t k = 0; k < setups.size(); ++k) {
      Setup& s = setups[(k + static_cast<size_t>(r)) % setups.size()];
      recompose::set_selective_replay_enabled(s.mode != Mode::SelectiveRerun);
      recompose::reset_selective_replay_stats();
      s.net->zero_grad();
      examples::synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      torch::Tensor loss;
      {
        recompose::SavedTensorMeter meter;
        loss = s.net->forward(x).square().mean();
        s.held = meter.bytes_held();
      }
      loss.backward();
      examples::synchronize(device);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) s.seconds.push_back(dt);  // round 0 warms up
      const auto stats = recompose::selective_replay_stats();
      s.replayed = stats.replayed, s.fallbacks = stats.fallbacks;
    }
  }
  recompose::set_selective_replay_enabled(true);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double none = median(setups[0].seconds);
  std::printf(
      "%lld ResNet basic blocks, %lld channels, %lldx%lld, batch %lld, on %s; median of %lld "
      "interleaved steps\n",
      static_cast<long long>(c.blocks), static_cast<long long>(c.channels),
      static_cast<long long>(c.size), static_cast<long long>(c.size),
      static_cast<long long>(c.batch), device.str().c_str(), static_cast<long long>(c.reps));
  std::printf("%-32s %10s %8s %12s %8s %9s %9s\n", "mode", "step ms", "x none", "held", "x none",
              "replayed", "fallbacks");
  for (const Setup& s : setups) {
    const double t = median(s.seconds);
    std::printf("%-32s %10.2f %8.3f %10.2f MiB %8.3f %9lld %9lld\n", name_of(s.mode), t * 1e3,
                t / none, static_cast<double>(s.held) / (1 << 20),
                static_cast<double>(s.held) / static_cast<double>(setups[0].held),
                static_cast<long long>(s.replayed), static_cast<long long>(s.fallbacks));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cnn_bench: %s\n", e.what());
  return 2;
}
