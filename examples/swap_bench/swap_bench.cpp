// Activation swap benchmark.
//
//   ./build/examples/swap_bench/swap_bench                 # CUDA if built with it and a GPU is
//   here
//   ./build/examples/swap_bench/swap_bench --device cpu    # overhead only: CPU swap saves nothing
//
// CUDA: a transformer-like stack (LayerNorm, attention, 4x MLP) trained one step at a time with
// none / full checkpointing / selective checkpointing (transformer_policy) / swap (AsyncSaveOnCpu,
// one group per block). Peak device memory comes from the CUDA caching allocator's statistics;
// activation memory is the peak of the step minus what was allocated before it. Ratios are
// against "none".
// CPU: an MLP stack with and without AsyncSaveOnCpu; the ratio of step times is the cost of the
// host-to-host copies, and the bytes offloaded are what a GPU would move over the bus.
#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/swap.h>

#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string device;  // "" = cuda when available
  int64_t layers = 8;
  int64_t batch = 8;
  int64_t seq = 1024;
  int64_t dim = 1024;
  int64_t heads = 16;
  int64_t steps = 5;
  int64_t warmup = 2;
  int64_t rounds = 3;
  int64_t prefetch = 1;
  std::string dtype = "bf16";
};

void usage() {
  std::cout << "usage: swap_bench [--device cpu|cuda] [--layers N] [--batch B] [--seq T] [--dim D] "
               "[--heads H]\n"
               "                  [--steps S] [--warmup W] [--rounds R] [--prefetch GROUPS] "
               "[--dtype fp32|bf16]\n"
               "Step time: median over R interleaved rounds of S steps. Swap counters: per step.\n";
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, int64_t*> ints{
      {"--layers", &a.layers}, {"--batch", &a.batch},       {"--seq", &a.seq},
      {"--dim", &a.dim},       {"--heads", &a.heads},       {"--steps", &a.steps},
      {"--warmup", &a.warmup}, {"--prefetch", &a.prefetch}, {"--rounds", &a.rounds}};
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--help" || key == "-h") {
      usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      usage();
      std::exit(2);
    }
    const std::string value = argv[++i];
    if (key == "--device") {
      a.device = value;
    } else if (key == "--dtype") {
      a.dtype = value;
    } else if (auto it = ints.find(key); it != ints.end()) {
      *it->second = std::stoll(value);
    } else {
      usage();
      std::exit(2);
    }
  }
  if (a.steps < 1 || a.rounds < 1 || a.layers < 1 || a.warmup < 0 || a.dim % a.heads != 0) {
    std::cerr << "swap_bench: steps, rounds and layers must be >= 1, warmup >= 0, dim a multiple "
                 "of heads\n";
    std::exit(2);
  }
  return a;
}

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Models

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    auto parts =
        qkv->forward(ln1->forward(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto attn =
        at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true);
    auto h = x + proj->forward(attn.transpose(1, 2).reshape({b, t, d}));
    return h + fc2->forward(torch::gelu(fc1->forward(ln2->forward(h))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct MlpLayerImpl : torch::nn::Module {
  explicit MlpLayerImpl(int64_t dim) { fc = register_module("fc", torch::nn::Linear(dim, dim)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::gelu(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(MlpLayer);

// ---------------------------------------------------------------------------------------------
// One training step per mode

enum class Mode { None, Full, Selective, Swap };
const char* name(Mode m) {
  switch (m) {
    case Mode::None:
      return "none";
    case Mode::Full:
      return "full";
    case Mode::Selective:
      return "selective";
    case Mode::Swap:
      return "swap";
  }
  return "?";
}

template <class Layer>
torch::Tensor run_layers(std::vector<Layer>& layers, torch::Tensor x, Mode mode,
                         const std::shared_ptr<recompose::SwapManager>& manager) {
  std::optional<recompose::AsyncSaveOnCpu> offload;
  if (mode == Mode::Swap) offload.emplace(manager);
  for (auto& layer : layers) {
    auto* impl = layer.get();
    auto body = [impl](const torch::Tensor& in) { return impl->forward(in); };
    switch (mode) {
      case Mode::None:
        x = layer->forward(x);
        break;
      case Mode::Full:
        x = recompose::checkpoint(body, x);
        break;
      case Mode::Selective:
        x = recompose::checkpoint(
            recompose::CheckpointOptions().policy(recompose::transformer_policy()), body, x);
        break;
      case Mode::Swap: {
        recompose::SwapGroupScope group(*manager);
        x = layer->forward(x);
        break;
      }
    }
  }
  return x;
}

struct Result {
  double step_ms = 0;
  int64_t activation_bytes = -1;  // -1: not measured (CPU)
  recompose::SwapStats swap;
};

// Times every mode in `rounds` interleaved rounds (so that drift of a shared machine hits all
// modes alike) and keeps the median step time and the highest activation peak of each.
template <class Layer>
std::vector<std::pair<Mode, Result>> measure(std::vector<Layer>& layers, const torch::Tensor& input,
                                             const std::vector<Mode>& modes, const Args& args,
                                             const std::function<void()>& sync) {
  std::vector<std::shared_ptr<recompose::SwapManager>> managers;
  for (size_t i = 0; i < modes.size(); ++i) {
    managers.push_back(
        recompose::SwapManager::create(recompose::SwapOptions().prefetch_groups(args.prefetch)));
  }
  auto step = [&](size_t m) {
    auto loss = run_layers(layers, input, modes[m], managers[m]).to(torch::kFloat32).pow(2).mean();
    loss.backward();
    for (auto& layer : layers) {
      for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
    }
  };
  for (size_t m = 0; m < modes.size(); ++m) {
    for (int64_t i = 0; i < args.warmup; ++i) step(m);
    managers[m]->reset_stats();
  }
  sync();
  std::vector<std::vector<double>> times(modes.size());
  std::vector<Result> results(modes.size());
  for (int64_t round = 0; round < args.rounds; ++round) {
    for (size_t m = 0; m < modes.size(); ++m) {
#ifdef RECOMPOSE_WITH_CUDA
      namespace alloc = c10::cuda::CUDACachingAllocator;
      const bool cuda = input.is_cuda();
      const auto dev = input.device().index();
      constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      int64_t before = 0;
      if (cuda) {
        alloc::resetPeakStats(dev);
        before = alloc::getDeviceStats(dev).allocated_bytes[all].current;
      }
#endif
      const auto start = Clock::now();
      for (int64_t i = 0; i < args.steps; ++i) step(m);
      sync();
      times[m].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count() /
                         static_cast<double>(args.steps));
#ifdef RECOMPOSE_WITH_CUDA
      if (cuda) {
        results[m].activation_bytes =
            std::max(results[m].activation_bytes,
                     alloc::getDeviceStats(dev).allocated_bytes[all].peak - before);
      }
#endif
    }
  }
  std::vector<std::pair<Mode, Result>> out;
  for (size_t m = 0; m < modes.size(); ++m) {
    std::sort(times[m].begin(), times[m].end());
    results[m].step_ms = times[m][times[m].size() / 2];
    results[m].swap = managers[m]->stats();
    out.emplace_back(modes[m], results[m]);
  }
  return out;
}

// `steps`: the number of timed steps the counters cover.
void print(const std::vector<std::pair<Mode, Result>>& results, int64_t steps) {
  const Result& base = results.front().second;
  std::printf("%-10s %10s %8s %14s %8s %14s %8s %6s %6s\n", "mode", "step ms", "ratio", "act MiB",
              "ratio", "offload MiB", "sync", "late", "early");
  for (const auto& [mode, r] : results) {
    const double mib = 1024.0 * 1024.0;
    const bool mem = r.activation_bytes >= 0 && base.activation_bytes > 0;
    std::printf(
        "%-10s %10.2f %8.3f %14s %8s %14.1f %8.1f %6.1f %6.1f\n", name(mode), r.step_ms,
        r.step_ms / base.step_ms,
        mem ? std::to_string(static_cast<int64_t>(r.activation_bytes / mib)).c_str() : "-",
        mem ? std::to_string(static_cast<double>(r.activation_bytes) / base.activation_bytes)
                  .substr(0, 5)
                  .c_str()
            : "-",
        static_cast<double>(r.swap.bytes_offloaded) / mib / static_cast<double>(steps),
        static_cast<double>(r.swap.sync_loads) / steps,
        static_cast<double>(r.swap.late_reloads) / steps,
        static_cast<double>(r.swap.early_returns) / steps);
  }
}

#ifdef RECOMPOSE_WITH_CUDA
// Copy bandwidth between the GPU and pinned host memory: the link's peak (one 512 MiB copy each
// way on the current stream, best of 5) against what SwapManager achieves (32 tensors of one
// activation's size offloaded, then all prefetched back, best of 5 after a warm-up that fills
// its pinned pool).
void print_bandwidth(int64_t activation_bytes) {
  constexpr int64_t kLinkBytes = int64_t{512} << 20;
  constexpr int kReps = 5;
  const double gb = 1e9;
  // Best time of `copy` over kReps after a warm-up; `prepare` runs untimed before each.
  auto best_seconds = [&](
                          const std::function<void()>& copy,
                          const std::function<void()>& prepare = [] {}) {
    double best = 1e30;
    for (int i = 0; i <= kReps; ++i) {  // the first round warms up
      prepare();
      torch::cuda::synchronize();
      const auto start = Clock::now();
      copy();
      torch::cuda::synchronize();
      if (i > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return best;
  };
  auto device =
      torch::empty({kLinkBytes}, torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA));
  auto host =
      torch::empty({kLinkBytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  const double link_d2h =
      kLinkBytes / best_seconds([&] { host.copy_(device, /*non_blocking=*/true); }) / gb;
  const double link_h2d =
      kLinkBytes / best_seconds([&] { device.copy_(host, /*non_blocking=*/true); }) / gb;

  constexpr int kTensors = 32;
  auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
  std::vector<torch::Tensor> sources;
  for (int i = 0; i < kTensors; ++i) {
    sources.push_back(torch::empty(
        {activation_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA)));
  }
  std::vector<std::shared_ptr<recompose::SwappedTensor>> handles;
  auto offload_all = [&] {
    for (auto& h : handles) h->release();
    handles.clear();
    for (const auto& t : sources) handles.push_back(manager->offload(t));
    manager->synchronize();
  };
  const auto total = static_cast<double>(kTensors * activation_bytes);
  const double swap_d2h = total / best_seconds(offload_all) / gb;
  auto reload_all = [&] {
    for (auto& h : handles) h->prefetch();
    manager->synchronize();
  };
  const double swap_h2d = total / best_seconds(reload_all, offload_all) / gb;
  for (auto& h : handles) h->release();
  std::printf("Copy bandwidth, GB/s (1e9 bytes/s):              device->host  host->device\n");
  std::printf("  link peak (512 MiB copies, pinned)             %12.1f  %12.1f\n", link_d2h,
              link_h2d);
  std::printf(
      "  SwapManager (%d x %.1f MiB, pinned pool warm) %12.1f  %12.1f   (%.0f%% / %.0f%% of the "
      "link)\n",
      kTensors, static_cast<double>(activation_bytes) / (1024.0 * 1024.0), swap_d2h, swap_h2d,
      100.0 * swap_d2h / link_d2h, 100.0 * swap_h2d / link_h2d);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  bool use_cuda = false;
#ifdef RECOMPOSE_WITH_CUDA
  use_cuda = torch::cuda::is_available();
#endif
  if (args.device == "cuda" && !use_cuda) {
    std::cerr << "swap_bench: --device cuda, but this build has no CUDA or no GPU is visible\n";
    return 1;
  }
  if (args.device == "cpu") use_cuda = false;
  torch::manual_seed(0);

  if (use_cuda) {
    const auto dtype = args.dtype == "fp32" ? torch::kFloat32 : torch::kBFloat16;
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    std::vector<Block> blocks;
    for (int64_t i = 0; i < args.layers; ++i) {
      blocks.emplace_back(args.dim, args.heads);
      blocks.back()->to(torch::kCUDA, dtype);
    }
    auto input = torch::randn({args.batch, args.seq, args.dim}, options);
    std::printf(
        "CUDA transformer stack: %lld blocks, batch %lld, seq %lld, dim %lld, heads %lld, %s, "
        "prefetch %lld\n",
        static_cast<long long>(args.layers), static_cast<long long>(args.batch),
        static_cast<long long>(args.seq), static_cast<long long>(args.dim),
        static_cast<long long>(args.heads), args.dtype.c_str(),
        static_cast<long long>(args.prefetch));
    auto sync = [] { torch::cuda::synchronize(); };
    print(measure(blocks, input, {Mode::None, Mode::Full, Mode::Selective, Mode::Swap}, args, sync),
          args.steps * args.rounds);
#ifdef RECOMPOSE_WITH_CUDA
    print_bandwidth(input.numel() * input.element_size());
#endif
    return 0;
  }

  // CPU: overhead of the host-to-host copies only.
  std::vector<MlpLayer> layers;
  for (int64_t i = 0; i < args.layers; ++i) layers.emplace_back(args.dim);
  auto input = torch::randn({args.batch * 32, args.dim});
  std::printf(
      "CPU MLP stack: %lld layers, %lld x %lld fp32 (no GPU: swap copies host to host and saves no "
      "memory; this shows its overhead)\n",
      static_cast<long long>(args.layers), static_cast<long long>(args.batch * 32),
      static_cast<long long>(args.dim));
  print(measure(layers, input, {Mode::None, Mode::Swap}, args, [] {}), args.steps * args.rounds);
  return 0;
}
