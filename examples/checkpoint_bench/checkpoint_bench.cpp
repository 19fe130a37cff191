// Step time and bytes held for backward of a stack of transformer blocks, with and without
// apply_checkpoint on every block, measured side by side (interleaved repetitions, medians).
//
//   ./build/examples/checkpoint_bench/checkpoint_bench [--device auto|cpu|cuda] [--layers 8]
//       [--width 128] [--heads 4] [--seq 64] [--batch 8] [--reps 7] [--threads 0]
#include "../common/device.h"
#include "../common/transformer_block.h"

#include <recompose/recompose.h>

#include <torch/torch.h>

#include <algorithm>
#include <ctime>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t layers = 8, width = 128, heads = 4, seq = 64, batch = 8, reps = 7, threads = 0;
  std::string device = "auto";  // auto: CUDA when available
};

const char* kUsage =
    "usage: checkpoint_bench [--device auto|cpu|cuda] [--layers 8] [--width 128] [--heads 4] [--seq 64]\n"
    "                        [--batch 8] [--reps 7] [--threads 0]\n";

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") throw std::invalid_argument("");
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    if (k == "--device") {
      c.device = argv[i + 1];
      continue;
    }
    const int64_t v = examples::int_flag(k, argv[i + 1]);
    if (k == "--layers") c.layers = v;
    else if (k == "--width") c.width = v;
    else if (k == "--heads") c.heads = v;
    else if (k == "--seq") c.seq = v;
    else if (k == "--batch") c.batch = v;
    else if (k == "--reps") c.reps = v;
    else if (k == "--threads") c.threads = v;
    else throw std::invalid_argument("unknown flag " + k);
  }
  return c;
}

struct Stack {
  std::vector<examples::TransformerBlock> blocks;
  Stack(const Config& c, const torch::Device& device, bool checkpointed) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.emplace_back(c.width, c.heads);
      blocks.back()->to(device);
      if (checkpointed) recompose::apply_checkpoint(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x;
  }
};

struct Sample {
  double seconds;
  double cpu_seconds;  // process CPU time: less disturbed than wall time on a shared machine
  int64_t bytes_held;
  int64_t peak_bytes;  // peak device memory of the step (CUDA only; -1 on CPU)
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

Sample step(Stack& stack, const torch::Tensor& x) {
  const torch::Device device = x.device();
  examples::synchronize(device);
  examples::reset_peak_device_memory(device);
  const double c0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t held = 0;
  {
    recompose::SavedTensorMeter meter;
    torch::Tensor loss = stack.forward(x).pow(2).mean();
    held = meter.bytes_held();
    loss.backward();
  }
  examples::synchronize(device);
  const auto t1 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(), process_cpu_seconds() - c0, held,
          examples::peak_device_memory(device)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  torch::Device device(torch::kCPU);
  try {
    c = parse(argc, argv);
    device = examples::pick_device(c.device);
  } catch (const std::exception& e) {
    if (*e.what()) std::cerr << "checkpoint_bench: " << e.what() << "\n";
    std::cerr << kUsage;
    return 2;
  }
  if (c.threads > 0) at::set_num_threads(static_cast<int>(c.threads));
  Stack plain(c, device, false), ckpt(c, device, true);
  torch::Tensor x = torch::randn({c.batch, c.seq, c.width}, torch::TensorOptions().device(device));
  const int64_t input_bytes = x.numel() * static_cast<int64_t>(sizeof(float));

  step(plain, x);  // warm-up: allocator, thread pools
  step(ckpt, x);
  std::vector<double> t_plain, t_ckpt, c_plain, c_ckpt;
  int64_t held_plain = 0, held_ckpt = 0, peak_plain = -1, peak_ckpt = -1;
  for (int64_t r = 0; r < c.reps; ++r) {
    const Sample a = step(plain, x);
    const Sample b = step(ckpt, x);
    t_plain.push_back(a.seconds);
    t_ckpt.push_back(b.seconds);
    c_plain.push_back(a.cpu_seconds);
    c_ckpt.push_back(b.cpu_seconds);
    held_plain = a.bytes_held;
    held_ckpt = b.bytes_held;
    peak_plain = a.peak_bytes;
    peak_ckpt = b.peak_bytes;
  }
  const double tp = median(t_plain), tc = median(t_ckpt), cp = median(c_plain), cc = median(c_ckpt);
  std::printf("recompose checkpoint_bench: %lld transformer blocks, width %lld, heads %lld, seq %lld, batch %lld, "
              "%lld interleaved reps, LibTorch %s, %s, %d threads\n",
              (long long)c.layers, (long long)c.width, (long long)c.heads, (long long)c.seq, (long long)c.batch,
              (long long)c.reps, TORCH_VERSION, device.str().c_str(), at::get_num_threads());
  const bool cuda = device.is_cuda();
  std::printf("%-12s %14s %14s %18s%s\n", "", "step (ms)", "CPU (ms)", "held for bwd (MiB)",
              cuda ? "  step peak (MiB)" : "");
  auto row = [&](const char* name, double t, double cpu, int64_t held, int64_t peak) {
    std::printf("%-12s %14.1f %14.1f %18.2f", name, t * 1e3, cpu * 1e3, held / 1048576.0);
    if (cuda) std::printf("  %15.2f", peak / 1048576.0);
    std::printf("\n");
  };
  row("none", tp, cp, held_plain, peak_plain);
  row("full", tc, cc, held_ckpt, peak_ckpt);
  if (cuda) std::printf("ratio full/none: step peak device memory %.3f\n", static_cast<double>(peak_ckpt) / peak_plain);
  std::printf("ratios full/none: step time %.3f, CPU time %.3f, bytes held %.4f (1/L = %.4f; held = %.2f block inputs)\n",
              tc / tp, cc / cp,
              static_cast<double>(held_ckpt) / held_plain, 1.0 / c.layers,
              static_cast<double>(held_ckpt) / input_bytes);
  return 0;
}
