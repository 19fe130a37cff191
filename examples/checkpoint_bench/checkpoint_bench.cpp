// Step time and bytes held for backward of a stack of transformer blocks, with and without
// apply_checkpoint on every block, measured side by side (interleaved repetitions, medians).
// With --budget, also under the memory-budget planner's plan for each budget (profiled once on
// the stack, solved per budget, applied to a copy with the same weights), in the same rounds.
//
//   ./build/examples/checkpoint_bench/checkpoint_bench [--device auto|cpu|cuda] [--layers 8]
//       [--width 128] [--heads 4] [--seq 64] [--batch 8] [--reps 7] [--threads 0]
//       [--budget 25%,50%,75%] [--print-plans 1] [--print-profile 1]
#include "../common/allocator_tuning.h"
#include "../common/device.h"
#include "../common/transformer_block.h"

#include <recompose/planner.h>
#include <recompose/recompose.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t layers = 8, width = 128, heads = 4, seq = 64, batch = 8, reps = 7, threads = 0;
  std::string device = "auto";       // auto: CUDA when available
  std::vector<std::string> budgets;  // --budget: planner budgets ("50%", "12MiB")
  bool print_plans = false;          // --print-plans 1: each plan's table
  bool print_profile = false;        // --print-profile 1: the planner's profile (modules, then ops)
};

const char* kUsage =
    "usage: checkpoint_bench [--device auto|cpu|cuda] [--layers 8] [--width 128] [--heads 4] "
    "[--seq 64]\n"
    "                        [--batch 8] [--reps 7] [--threads 0] [--budget B1,B2,...] "
    "[--print-plans 1]\n"
    "                        [--print-profile 1]\n"
    "  --budget: also run the planner's plan for each budget (\"50%\" of no checkpointing, or "
    "bytes)\n"
    "  selective: every block under transformer_policy(), the fixed policy a plan must beat\n";

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
    if (k == "--budget") {
      std::string list = argv[i + 1];
      for (size_t start = 0; start <= list.size();) {
        const size_t end = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, end - start);
        recompose::Budget::parse(item);  // std::invalid_argument names what is wrong
        c.budgets.push_back(item);
        start = end + 1;
      }
      continue;
    }
    const int64_t v = examples::int_flag(k, argv[i + 1]);
    if (k == "--layers")
      c.layers = v;
    else if (k == "--width")
      c.width = v;
    else if (k == "--heads")
      c.heads = v;
    else if (k == "--seq")
      c.seq = v;
    else if (k == "--batch")
      c.batch = v;
    else if (k == "--reps")
      c.reps = v;
    else if (k == "--threads")
      c.threads = v;
    else if (k == "--print-plans")
      c.print_plans = v != 0;
    else if (k == "--print-profile")
      c.print_profile = v != 0;
    else
      throw std::invalid_argument("unknown flag " + k);
  }
  return c;
}

// A module, so that the planner can name its blocks ("blocks.0", ...); same seed, same weights.
struct Stack : torch::nn::Module {
  std::vector<examples::TransformerBlock> blocks;
  Stack(const Config& c, const torch::Device& device, bool checkpointed) {
    torch::manual_seed(0);
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.emplace_back(c.width, c.heads);
      blocks.back()->to(device);
      list->push_back(blocks.back());
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
  // Like the GPT example: a training process keeps its freed activations (glibc's defaults would
  // fault every step's memory in again, and charge it to whatever holds the most).
  const auto malloc_tuning = examples::tune_malloc_for_training();
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
  torch::Tensor x = torch::randn({c.batch, c.seq, c.width}, torch::TensorOptions().device(device));
  const int64_t input_bytes = x.numel() * static_cast<int64_t>(sizeof(float));

  // Variants measured in the same interleaved rounds: none, full, then one plan per budget.
  struct Variant {
    std::string name;
    std::unique_ptr<Stack> stack;
    int64_t budget_bytes = -1;
    std::vector<Sample> samples;
  };
  std::vector<Variant> variants;
  auto variant = [&](std::string name, bool checkpointed) {
    Variant v;
    v.name = std::move(name);
    v.stack = std::make_unique<Stack>(c, device, checkpointed);
    return v;
  };
  variants.push_back(variant("none", false));
  variants.push_back(variant("full", true));
  variants.push_back(variant("selective", false));
  for (auto& block : variants.back().stack->blocks) {
    recompose::apply_checkpoint(
        block, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
  }
  step(*variants[0].stack, x);  // warm-up before profiling: allocator, thread pools
  double profile_seconds = 0, solve_seconds = 0;
  if (!c.budgets.empty()) {
    Stack profiled(c, device, false);
    step(profiled, x);
    const auto profile =
        recompose::profile_memory(profiled, [&] { profiled.forward(x).pow(2).mean().backward(); });
    profile_seconds = profile.profile_seconds;
    if (c.print_profile) std::printf("%s\n", profile.to_string().c_str());
    for (const auto& text : c.budgets) {
      const auto plan = recompose::solve_plan(profile, recompose::Budget::parse(text));
      solve_seconds += plan.solve_seconds;
      Variant v = variant("planned " + text, false);
      v.budget_bytes = plan.budget_bytes;
      recompose::apply_plan(*v.stack, plan);
      if (c.print_plans) std::printf("plan for %s:\n%s\n", text.c_str(), plan.to_table().c_str());
      variants.push_back(std::move(v));
    }
  }
  for (auto& v : variants) step(*v.stack, x);  // warm-up
  for (int64_t r = 0; r < c.reps; ++r) {
    for (auto& v : variants) v.samples.push_back(step(*v.stack, x));
  }
  auto median_of = [](const Variant& v, double Sample::*field) {
    std::vector<double> values;
    for (const auto& s : v.samples) values.push_back(s.*field);
    return median(values);
  };

  std::printf(
      "recompose checkpoint_bench: %lld transformer blocks, width %lld, heads %lld, seq %lld, "
      "batch %lld, "
      "%lld interleaved reps, LibTorch %s, %s, %d threads\n",
      (long long)c.layers, (long long)c.width, (long long)c.heads, (long long)c.seq,
      (long long)c.batch, (long long)c.reps, TORCH_VERSION, device.str().c_str(),
      at::get_num_threads());
  std::printf("memory: %s\n", examples::describe(malloc_tuning));
  const bool cuda = device.is_cuda();
  const Variant& none = variants[0];
  const double tp = median_of(none, &Sample::seconds), cp = median_of(none, &Sample::cpu_seconds);
  const int64_t held_plain = none.samples.back().bytes_held,
                peak_plain = none.samples.back().peak_bytes;
  std::printf("%-16s %10s %10s %18s%s %8s %8s %8s\n", "", "step (ms)", "CPU (ms)",
              "held for bwd (MiB)", cuda ? "  step peak (MiB)" : "", "time x", "CPU x", "held x");
  for (const auto& v : variants) {
    const double t = median_of(v, &Sample::seconds), cpu = median_of(v, &Sample::cpu_seconds);
    const int64_t held = v.samples.back().bytes_held;
    std::printf("%-16s %10.1f %10.1f %18.2f", v.name.c_str(), t * 1e3, cpu * 1e3, held / 1048576.0);
    if (cuda) std::printf("  %15.2f", v.samples.back().peak_bytes / 1048576.0);
    std::printf(" %8.3f %8.3f %8.3f", t / tp, cpu / cp, static_cast<double>(held) / held_plain);
    if (v.budget_bytes >= 0) {
      std::printf("  (budget %.2f MiB: %s)", v.budget_bytes / 1048576.0,
                  held <= v.budget_bytes * 1.05 ? "within" : "OVER");
    }
    std::printf("\n");
  }
  const Variant& full = variants[1];
  const int64_t held_ckpt = full.samples.back().bytes_held;
  if (cuda) {
    std::printf("ratio full/none: step peak device memory %.3f\n",
                static_cast<double>(full.samples.back().peak_bytes) / peak_plain);
  }
  std::printf(
      "ratios full/none: step time %.3f, CPU time %.3f, bytes held %.4f (1/L = %.4f; held = %.2f "
      "block inputs)\n",
      median_of(full, &Sample::seconds) / tp, median_of(full, &Sample::cpu_seconds) / cp,
      static_cast<double>(held_ckpt) / held_plain, 1.0 / c.layers,
      static_cast<double>(held_ckpt) / input_bytes);
  if (!c.budgets.empty()) {
    std::printf(
        "planner: profiling %.1f ms (%.2f steps of none), solving %.3f ms for %zu budgets\n",
        profile_seconds * 1e3, profile_seconds / tp, solve_seconds * 1e3, c.budgets.size());
  }
  return 0;
}
