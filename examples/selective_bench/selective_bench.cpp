// Selective activation checkpointing figures, in one run:
//  1. the per-op cost of the interception: ns per op for a small op, plain and under a selective
//     forward context (pass-through policy, save-everything policy) and under the recompute
//     context (recompute / replay), in regions of --region-ops ops (200 by default: issue 45's
//     measure; the region's entry and exit are not timed), in wall-clock time and in the thread's
//     CPU time (the host's work alone: other processes' load moves it much less);
//  2. a stack of small transformer blocks, none / full / selective (transformer_policy)
//     checkpointing: step time (forward + backward) and bytes held for backward, as ratios to
//     none. Repetitions are interleaved; figures are medians;
//  3. what one selective region's recomputation costs: a GPT-like block with dropout
//     (transformer_policy), forward and backward timed apart, none against selective: the host
//     time per op the policy sees in the forward, and the backward's extra time per region (its
//     recomputation), with the selective replay and with it off (the region's forward run again);
//     the replay's host time against the host time of the ops it ran (recompose::
//     selective_replay_stats).
//
//   selective_bench [--device auto|cpu|cuda] [--ops N] [--region-ops M] [--reps R] [--blocks L]
//                   [--batch B] [--seq T] [--dim D] [--threads K] [--section 1|2|3 (default: all)]
//
// glibc malloc is tuned as in the GPT example (examples/common/allocator_tuning.h): with glibc's
// defaults the page faults of freed and re-faulted activations are charged to whichever
// configuration holds the most.
//
// On CUDA the stack also reports the peak device memory of a step.
#include "../common/allocator_tuning.h"
#include "../common/device.h"

#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The calling thread's CPU time, in seconds.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Wall-clock and thread CPU seconds of f().
struct Timed {
  double wall = 0;
  double cpu = 0;
  Timed& operator+=(const Timed& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};
template <class F>
Timed timed(F&& f) {
  const double cpu0 = thread_cpu_seconds();
  const double wall = seconds(std::forward<F>(f));
  return {wall, thread_cpu_seconds() - cpu0};
}

// ---------------------------------------------------------------------------------------------
// 1. Per-op overhead

recompose::SelectivePolicy constant(recompose::CheckpointPolicy p) {
  return recompose::SelectivePolicy([p](const recompose::SelectiveCheckpointContext&,
                                        const c10::OperatorHandle&,
                                        const torch::jit::Stack&) { return p; });
}

void per_op_overhead(int64_t ops, int64_t region_ops, int reps, const torch::Device& device) {
  torch::NoGradGuard no_grad;  // the interception does not depend on autograd; keep the op cheap
  const torch::Tensor x = torch::ones({4}, torch::TensorOptions().device(device));
  const torch::Tensor y = torch::ones({4}, torch::TensorOptions().device(device));
  auto loop = [&] {
    torch::Tensor out;
    for (int64_t i = 0; i < region_ops; ++i) out = at::add(x, y);
    examples::synchronize(device);
    return out;
  };
  // `ops` ops in regions of `region_ops`: the time of the ops alone (entering and leaving a
  // region, and making its contexts, are not timed).
  const int64_t regions = std::max<int64_t>(ops / region_ops, 1);
  auto in_regions = [regions](const std::function<Timed()>& one_region) {
    Timed t;
    for (int64_t r = 0; r < regions; ++r) t += one_region();
    return t;
  };
  const auto pass_through = constant(recompose::CheckpointPolicy::PREFER_RECOMPUTE);
  const auto save_all = constant(recompose::CheckpointPolicy::MUST_SAVE);

  struct Row {
    const char* name;
    std::function<Timed()> run;  // time for `ops` ops
    std::vector<double> wall, cpu;
  };
  // The recompute rows need a forward over the same ops first (not timed).
  auto recompute_row = [&](const recompose::SelectivePolicy& policy) {
    return [&, policy] {
      return in_regions([&] {
        auto contexts = recompose::create_selective_checkpoint_contexts(policy);
        {
          auto token = contexts->enter_forward();
          loop();
        }
        auto token = contexts->enter_recompute();
        return timed(loop);
      });
    };
  };
  auto forward_row = [&](const recompose::SelectivePolicy& policy, bool replay) {
    return [&, policy, replay] {
      return in_regions([&] {
        // Off: what a region pays when nothing records for a replay (the switch is read when
        // the forward is entered).
        recompose::set_selective_replay_enabled(replay);
        auto contexts = recompose::create_selective_checkpoint_contexts(policy);
        auto token = contexts->enter_forward();
        recompose::set_selective_replay_enabled(true);
        return timed(loop);
      });
    };
  };
  std::vector<Row> rows;
  rows.push_back(
      {"plain (no interception)", [&] { return in_regions([&] { return timed(loop); }); }, {}, {}});
  rows.push_back({"forward, pass-through policy", forward_row(pass_through, true), {}, {}});
  rows.push_back({"forward, pass-through, replay off", forward_row(pass_through, false), {}, {}});
  rows.push_back({"forward, save-everything policy", forward_row(save_all, true), {}, {}});
  rows.push_back({"recompute, op recomputed", recompute_row(pass_through), {}, {}});
  rows.push_back({"recompute, op replayed (not run)", recompute_row(save_all), {}, {}});

  for (auto& r : rows) r.run();  // warm-up
  for (int rep = 0; rep < reps; ++rep) {
    for (auto& r : rows) {
      const Timed t = r.run();
      r.wall.push_back(t.wall);
      r.cpu.push_back(t.cpu);
    }
  }
  const double timed_ops = static_cast<double>(regions * region_ops);
  auto ns_per_op = [timed_ops](const std::vector<double>& s) {
    return median(s) / timed_ops * 1e9;
  };
  const double plain_ns = ns_per_op(rows[0].wall);
  const double plain_cpu_ns = ns_per_op(rows[0].cpu);
  std::printf(
      "1. Per-op cost of the interception (at::add on 4 floats on %s, %lld ops in regions of "
      "%lld, median of %d)\n",
      device.str().c_str(), static_cast<long long>(regions * region_ops),
      static_cast<long long>(region_ops), reps);
  std::printf("   %-36s %10s %14s %14s %14s\n", "", "ns/op", "overhead ns/op", "cpu ns/op",
              "cpu overhead");
  for (const auto& r : rows) {
    const double ns = ns_per_op(r.wall);
    const double cpu_ns = ns_per_op(r.cpu);
    std::printf("   %-36s %10.1f %14.1f %14.1f %14.1f\n", r.name, ns, ns - plain_ns, cpu_ns,
                cpu_ns - plain_cpu_ns);
  }
  std::printf(
      "   (cpu: the thread's CPU time; on CUDA it includes the host's wait for the device at "
      "each region's end)\n");
}

// ---------------------------------------------------------------------------------------------
// 2. Transformer stack

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv = register_module("qkv",
                          torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(false)));
    proj =
        register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    up = register_module("up",
                         torch::nn::Linear(torch::nn::LinearOptions(dim, 4 * dim).bias(false)));
    down = register_module("down",
                           torch::nn::Linear(torch::nn::LinearOptions(4 * dim, dim).bias(false)));
  }

  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto parts = qkv(ln1(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4}).unbind(0);
    torch::Tensor scores =
        torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    torch::Tensor causal =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    torch::Tensor attn = torch::softmax(scores.masked_fill(causal, -1e9), -1);
    torch::Tensor ctx = torch::matmul(attn, parts[2]).transpose(1, 2).reshape({b, t, d});
    x = x + proj(ctx);
    return x + down(torch::gelu(up(ln2(x))));
  }

  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(Block);

struct Stack {
  std::vector<Block> blocks;
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x;
  }
};

Stack make_stack(int64_t layers, int64_t dim, int64_t heads, const torch::Device& device) {
  torch::manual_seed(0);
  Stack s;
  for (int64_t i = 0; i < layers; ++i) {
    s.blocks.emplace_back(dim, heads);
    s.blocks.back()->to(device);
  }
  return s;
}

void transformer_stack(int64_t layers, int64_t batch, int64_t seq, int64_t dim, int reps,
                       const torch::Device& device) {
  const int64_t heads = 4;
  struct Config {
    const char* name;
    Stack stack;
    std::vector<double> step_s;
    std::vector<double> bytes;
    std::vector<double> peak;  // peak device memory of a step (CUDA only)
  };
  std::vector<Config> configs;
  configs.push_back({"none", make_stack(layers, dim, heads, device), {}, {}, {}});
  configs.push_back({"full", make_stack(layers, dim, heads, device), {}, {}, {}});
  configs.push_back(
      {"selective (transformer_policy)", make_stack(layers, dim, heads, device), {}, {}, {}});
  configs.push_back(
      {"selective (every second mm)", make_stack(layers, dim, heads, device), {}, {}, {}});
  for (auto& b : configs[1].stack.blocks) recompose::apply_checkpoint(b);
  for (auto& b : configs[2].stack.blocks) {
    recompose::apply_checkpoint(
        b, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
  }
  for (auto& b : configs[3].stack.blocks) {
    recompose::apply_checkpoint(
        b, recompose::CheckpointOptions().policy(recompose::transformer_policy(
               recompose::TransformerPolicyOptions().recompute_every_second_mm(true))));
  }

  torch::manual_seed(1);
  const torch::Tensor input = torch::randn({batch, seq, dim}).to(device);
  std::vector<torch::Tensor> grads_of_first;
  auto step = [&](Config& c) {
    for (auto& b : c.stack.blocks) b->zero_grad();
    int64_t held = 0;
    examples::synchronize(device);
    examples::reset_peak_device_memory(device);
    const double s = seconds([&] {
      torch::Tensor loss;
      {
        recompose::SavedTensorMeter meter;
        loss = c.stack.forward(input).square().mean();
        // Autograd's saved tensors plus the outputs selective checkpointing keeps.
        held = meter.bytes_held();  // includes the outputs selective checkpointing keeps
      }
      loss.backward();
      examples::synchronize(device);
    });
    c.step_s.push_back(s);
    c.bytes.push_back(static_cast<double>(held));
    c.peak.push_back(static_cast<double>(examples::peak_device_memory(device)));
  };
  for (auto& c : configs) {  // warm-up, and a check that all configurations agree
    step(c);
    c.step_s.clear();
    c.bytes.clear();
    c.peak.clear();
  }
  for (size_t i = 1; i < configs.size(); ++i) {
    const auto& g0 = configs[0].stack.blocks[0]->qkv->weight.grad();
    const auto& gi = configs[i].stack.blocks[0]->qkv->weight.grad();
    if (!torch::equal(g0, gi)) {
      std::printf("   WARNING: %s gradients differ from none (max abs diff %g)\n", configs[i].name,
                  (g0 - gi).abs().max().item<double>());
    }
  }
  for (int rep = 0; rep < reps; ++rep) {
    for (auto& c : configs) step(c);
  }
  const double t0 = median(configs[0].step_s), b0 = median(configs[0].bytes),
               p0 = median(configs[0].peak);
  const bool cuda = device.is_cuda();
  std::printf(
      "\n2. Transformer stack on %s: %lld blocks, batch %lld, seq %lld, dim %lld, %lld heads "
      "(median of %d, "
      "interleaved)\n",
      device.str().c_str(), static_cast<long long>(layers), static_cast<long long>(batch),
      static_cast<long long>(seq), static_cast<long long>(dim), static_cast<long long>(heads),
      reps);
  std::printf("   %-32s %12s %10s %16s %10s%s\n", "", "step ms", "time/none", "bytes held",
              "bytes/none", cuda ? "  step peak MiB  peak/none" : "");
  for (const auto& c : configs) {
    const double t = median(c.step_s), b = median(c.bytes), p = median(c.peak);
    std::printf("   %-32s %12.2f %10.3f %16.0f %10.3f", c.name, t * 1e3, t / t0, b, b / b0);
    if (cuda) std::printf("  %13.2f %10.3f", p / 1048576.0, p / p0);
    std::printf("\n");
  }
}

// ---------------------------------------------------------------------------------------------
// 3. One selective region's recomputation

// The block of examples/gpt (pre-LayerNorm, biased linears, fused causal attention, dropout).
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t dim, int64_t heads, double p) : heads(heads), p(p) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
    fc = register_module("fc", torch::nn::Linear(dim, 4 * dim));
    fc_proj = register_module("fc_proj", torch::nn::Linear(4 * dim, dim));
  }

  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
    auto split = qkv(ln1(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto y = torch::scaled_dot_product_attention(split[0], split[1], split[2], {},
                                                 is_training() ? p : 0.0, true);
    x = x + torch::dropout(proj(y.transpose(1, 2).reshape({b, t, d})), p, is_training());
    return x + torch::dropout(fc_proj(torch::gelu(fc(ln2(x)))), p, is_training());
  }

  int64_t heads;
  double p;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_proj{nullptr};
};
TORCH_MODULE(GptBlock);

void region_recompute_cost(int64_t layers, int64_t batch, int64_t seq, int64_t dim, int reps,
                           const torch::Device& device) {
  const int64_t heads = 4;
  auto make = [&] {
    torch::manual_seed(0);
    std::vector<GptBlock> blocks;
    for (int64_t i = 0; i < layers; ++i) {
      blocks.emplace_back(dim, heads, 0.1);
      blocks.back()->to(device);
    }
    return blocks;
  };
  // Ops the policy sees per region: transformer_policy, counted.
  auto seen = std::make_shared<int64_t>(0);
  const auto inner = recompose::transformer_policy();
  const recompose::SelectivePolicy counted(
      [seen, inner](const recompose::SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                    const torch::jit::Stack& args) {
        ++*seen;
        return inner(ctx, op, args);
      });
  struct Config {
    const char* name;
    std::vector<GptBlock> blocks;
    bool replay = true;
    std::vector<double> fwd, bwd;
  };
  std::vector<Config> configs;
  configs.push_back({"none", make(), true, {}, {}});
  configs.push_back({"replay", make(), true, {}, {}});
  configs.push_back({"replay off", make(), false, {}, {}});
  for (size_t i = 1; i < configs.size(); ++i) {
    for (auto& b : configs[i].blocks)
      recompose::apply_checkpoint(b, recompose::CheckpointOptions().policy(counted));
  }
  torch::manual_seed(1);
  const torch::Tensor input = torch::randn({batch, seq, dim}).to(device).requires_grad_(true);
  recompose::SelectiveReplayStats replay_stats;
  auto step = [&](Config& c) {
    for (auto& b : c.blocks) b->zero_grad();
    recompose::set_selective_replay_enabled(c.replay);
    recompose::reset_selective_replay_stats();
    torch::manual_seed(2);  // the same dropout masks in every configuration
    torch::Tensor loss;
    examples::synchronize(device);
    c.fwd.push_back(seconds([&] {
      torch::Tensor x = input;
      for (auto& b : c.blocks) x = b(x);
      loss = x.square().mean();
      examples::synchronize(device);
    }));
    c.bwd.push_back(seconds([&] {
      loss.backward();
      examples::synchronize(device);
    }));
    if (c.replay && &c != &configs[0]) {
      const auto s = recompose::selective_replay_stats();
      replay_stats.replayed += s.replayed;
      replay_stats.fallbacks += s.fallbacks;
      replay_stats.ops_run += s.ops_run;
      replay_stats.ops_skipped += s.ops_skipped;
      replay_stats.ops_substituted += s.ops_substituted;
      replay_stats.draws_written += s.draws_written;
      replay_stats.writes_carried += s.writes_carried;
      replay_stats.replay_ns += s.replay_ns;
      replay_stats.op_ns += s.op_ns;
      if (s.fallbacks > 0) replay_stats.last_fallback_reason = s.last_fallback_reason;
    }
    recompose::set_selective_replay_enabled(true);
  };
  for (auto& c : configs) {  // warm-up, and a check that both agree
    step(c);
    c.fwd.clear();
    c.bwd.clear();
  }
  *seen = 0;
  replay_stats = {};
  const auto& g0 = configs[0].blocks[0]->qkv->weight.grad();
  for (size_t i = 1; i < configs.size(); ++i) {
    if (!torch::equal(g0, configs[i].blocks[0]->qkv->weight.grad())) {
      std::printf("   WARNING: selective (%s) gradients differ from none\n", configs[i].name);
    }
  }
  for (int rep = 0; rep < reps; ++rep) {
    for (auto& c : configs) step(c);
  }
  const double ops_per_region = static_cast<double>(*seen) / static_cast<double>(2 * reps * layers);
  const double fwd0 = median(configs[0].fwd), bwd0 = median(configs[0].bwd);
  const double fwd1 = median(configs[1].fwd), bwd1 = median(configs[1].bwd);
  const double fwd2 = median(configs[2].fwd), bwd2 = median(configs[2].bwd);
  std::printf(
      "\n3. One selective region's recomputation on %s: GPT-like block with dropout 0.1, %lld "
      "blocks, batch %lld, "
      "seq %lld, dim %lld (median of %d, interleaved)\n",
      device.str().c_str(), static_cast<long long>(layers), static_cast<long long>(batch),
      static_cast<long long>(seq), static_cast<long long>(dim), reps);
  std::printf("   %-44s %10s %18s %18s\n", "", "none", "selective, replay", "selective, rerun");
  std::printf("   %-44s %10.3f %18.3f %18.3f\n", "forward ms", fwd0 * 1e3, fwd1 * 1e3, fwd2 * 1e3);
  std::printf("   %-44s %10.3f %18.3f %18.3f\n", "backward ms", bwd0 * 1e3, bwd1 * 1e3, bwd2 * 1e3);
  std::printf("   %-44s %10.3f %18.3f %18.3f\n", "step / none", 1.0, (fwd1 + bwd1) / (fwd0 + bwd0),
              (fwd2 + bwd2) / (fwd0 + bwd0));
  std::printf("   %-44s %10s %18.2f %18.2f\n", "forward cost per op the policy sees, us", "",
              (fwd1 - fwd0) / static_cast<double>(layers) / ops_per_region * 1e6,
              (fwd2 - fwd0) / static_cast<double>(layers) / ops_per_region * 1e6);
  std::printf("   %-44s %10s %18.3f %18.3f\n", "recomputation per region (bwd - none), ms", "",
              (bwd1 - bwd0) / static_cast<double>(layers) * 1e3,
              (bwd2 - bwd0) / static_cast<double>(layers) * 1e3);
  std::printf("   ops the policy sees per region: %.0f\n", ops_per_region);
  const double regions = static_cast<double>(std::max<int64_t>(replay_stats.replayed, 1));
  std::printf(
      "   replay: %lld regions replayed, %lld fell back%s%s; per region %.1f ops run (%.1f as a "
      "cheaper op), %.1f recorded ops skipped, %.1f draws written back, %.1f writes carried by "
      "kept outputs\n",
      static_cast<long long>(replay_stats.replayed), static_cast<long long>(replay_stats.fallbacks),
      replay_stats.fallbacks > 0 ? ": " : "", replay_stats.last_fallback_reason.c_str(),
      static_cast<double>(replay_stats.ops_run) / regions,
      static_cast<double>(replay_stats.ops_substituted) / regions,
      static_cast<double>(replay_stats.ops_skipped) / regions,
      static_cast<double>(replay_stats.draws_written) / regions,
      static_cast<double>(replay_stats.writes_carried) / regions);
  std::printf(
      "   replay per region %.3f ms, host time of the ops it ran %.3f ms: replay / its ops %.3f; "
      "rerun (bwd - none) / the replay's ops %.3f\n",
      static_cast<double>(replay_stats.replay_ns) / regions * 1e-6,
      static_cast<double>(replay_stats.op_ns) / regions * 1e-6,
      static_cast<double>(replay_stats.replay_ns) /
          static_cast<double>(std::max<int64_t>(replay_stats.op_ns, 1)),
      (bwd2 - bwd0) / static_cast<double>(layers) /
          (static_cast<double>(replay_stats.op_ns) / regions * 1e-9));
}

const char* kFlags[] = {"--device", "--ops", "--region-ops", "--reps",    "--blocks",
                        "--batch",  "--seq", "--dim",        "--threads", "--section"};

std::string string_arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return examples::int_flag(name, argv[i + 1]);
  }
  return fallback;
}

void check_flags(int argc, char** argv) {
  for (int i = 1; i < argc; i += 2) {
    bool known = false;
    for (const char* f : kFlags) known = known || std::strcmp(argv[i], f) == 0;
    if (!known) throw std::invalid_argument(std::string("unknown flag ") + argv[i]);
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  }
}

}  // namespace

int main(int argc, char** argv) {
  examples::tune_malloc_for_training();
  int64_t section = 0;
  int64_t threads = 0, ops = 0, region_ops = 0, blocks = 0, batch = 0, seq = 0, dim = 0;
  int reps = 0;
  torch::Device device(torch::kCPU);
  try {
    check_flags(argc, argv);
    device = examples::pick_device(string_arg(argc, argv, "--device", "auto"));
    threads = arg(argc, argv, "--threads", 0);
    reps = static_cast<int>(arg(argc, argv, "--reps", 7));
    ops = arg(argc, argv, "--ops", 200000);
    region_ops = arg(argc, argv, "--region-ops", 200);
    if (ops < 1 || region_ops < 1)
      throw std::invalid_argument("--ops and --region-ops must be >= 1");
    blocks = arg(argc, argv, "--blocks", 4);
    batch = arg(argc, argv, "--batch", 4);
    seq = arg(argc, argv, "--seq", 128);
    dim = arg(argc, argv, "--dim", 256);
    section = arg(argc, argv, "--section", 0);
  } catch (const std::exception& e) {
    std::cerr << "selective_bench: " << e.what() << "\n"
              << "usage: selective_bench [--device auto|cpu|cuda] [--ops N] [--region-ops M] "
                 "[--reps R]\n"
              << "                       [--blocks L] [--batch B] [--seq T] [--dim D] [--threads "
                 "K] [--section 1|2|3]\n";
    return 2;
  }
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  if (section == 0 || section == 1) per_op_overhead(ops, region_ops, reps, device);
  if (section == 0 || section == 2) transformer_stack(blocks, batch, seq, dim, reps, device);
  if (section == 0 || section == 3) region_recompute_cost(blocks, batch, seq, dim, reps, device);
  return 0;
}
