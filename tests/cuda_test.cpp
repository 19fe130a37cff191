// CUDA cases: swap of device tensors (pinned buffers, copy streams, prefetch), the CUDA generator
// across a recomputation, CUDA autocast (bf16) and selective policies on CUDA.
//
// Compiled in every build: they use only LibTorch's device-generic API, which CPU-only LibTorch
// has too. Where no CUDA device is available at run time the suite is skipped visibly: doctest
// counts its cases under "skipped" in its summary (scripts/test.sh's totals line shows them),
// and the program says why when it starts.
#include "support/deterministic_cuda.h"
#include "support/grad_check.h"
#include "support/op_call_counter.h"
#include "support/two_heads.h"

#include <recompose/recompose.h>

#include <ATen/autocast_mode.h>
#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/jit/serialization/pickle.h>
#endif
#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
#include "selective/dispatch_interceptor.h"  // OpCounter: which ops backward really runs
#endif

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

// Asked once, when the cases register (doctest decorators are evaluated then).
bool has_cuda() {
  static const bool available = [] {
    const bool yes = torch::cuda::is_available();
    if (!yes) {
      std::cout << "[cuda_test] no CUDA device at run time: the test suite \"cuda\" is skipped "
                   "(doctest counts its cases as skipped)\n";
    }
    return yes;
  }();
  return available;
}

const c10::Device kCuda(c10::kCUDA, 0);

using rt::DeterministicCuda;

std::shared_ptr<recompose::SwapManager> test_manager(int64_t prefetch_groups = 1) {
  return recompose::SwapManager::create(
      recompose::SwapOptions().min_bytes(0).prefetch_groups(prefetch_groups));
}

// Linear + ReLU layers on the GPU; forward opens one swap group per layer when given a manager.
struct CudaMlp {
  explicit CudaMlp(int64_t layers, int64_t width = 256) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < layers; ++i) {
      fcs.emplace_back(width, width);
      fcs.back()->to(kCuda);
    }
  }
  torch::Tensor forward(torch::Tensor x, recompose::SwapManager* grouped = nullptr) {
    for (auto& fc : fcs) {
      std::optional<recompose::SwapGroupScope> group;
      if (grouped) group.emplace(*grouped);
      x = torch::relu(fc->forward(x));
    }
    return x;
  }
  std::vector<torch::Tensor> params() {
    std::vector<torch::Tensor> out;
    for (auto& fc : fcs) {
      for (auto& p : fc->parameters()) out.push_back(p);
    }
    return out;
  }
  std::vector<torch::nn::Linear> fcs;
};

std::vector<torch::Tensor> with(std::vector<torch::Tensor> v, const torch::Tensor& t) {
  v.push_back(t);
  return v;
}

// Linear, dropout, Linear: a checkpointable module whose recomputation draws random numbers.
struct DropoutBlockImpl : torch::nn::Module {
  explicit DropoutBlockImpl(int64_t width) {
    fc1 = register_module("fc1", torch::nn::Linear(width, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return fc2(torch::dropout(torch::relu(fc1(x)), 0.5, /*train=*/true));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DropoutBlock);

torch::Tensor cuda_generator_state() {
  return at::globalContext().defaultGenerator(kCuda).get_state();
}

// Two matrix products, elementwise ops, a reduction: the body of the selective and MUST_SWAP cases.
torch::Tensor mm_body(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
  torch::Tensor h = torch::mm(a, b).sin();
  torch::Tensor k = torch::mm(h, c);
  return torch::relu(k) * torch::sigmoid(k).sum();
}

struct MmLeaves {
  torch::Tensor a, b, c;
  static MmLeaves make() {
    torch::manual_seed(5);
    auto opts = torch::TensorOptions().device(kCuda).requires_grad(true);
    return {torch::randn({64, 128}, opts), torch::randn({128, 96}, opts),
            torch::randn({96, 80}, opts)};
  }
  std::vector<torch::Tensor> all() const { return {a, b, c}; }
};

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
// Counts the ops that really run below it; replayed (kept) ops never reach it. The mode is part
// of the thread-local state autograd hands to its CUDA device thread, so it sees backward there.
struct OpCounter final : recompose::detail::OpInterceptor {
  std::map<std::string, int> runs;
  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    ++runs[op.schema().name()];
    recompose::detail::run_below(op, stack);
  }
  int operator[](const std::string& name) const {
    auto it = runs.find(name);
    return it == runs.end() ? 0 : it->second;
  }
};

// Gradients of mm_body's squared sum with the body run through `run`, counting backward's ops.
std::vector<torch::Tensor> mm_grads(const std::function<torch::Tensor(const MmLeaves&)>& run,
                                    OpCounter& backward_ops) {
  const MmLeaves l = MmLeaves::make();
  torch::Tensor loss = run(l).square().sum();
  {
    recompose::detail::InterceptorScope scope(backward_ops);
    loss.backward();
  }
  std::vector<torch::Tensor> g;
  for (const auto& t : l.all()) g.push_back(t.grad());
  return g;
}
#endif

}  // namespace

TEST_SUITE("cuda" * doctest::skip(!has_cuda())) {
  // ---- Swap of device tensors ----------------------------------------------------------------

#ifndef RECOMPOSE_TEST_NO_SWAP
  TEST_CASE(
      "cuda swap: AsyncSaveOnCpu with per-layer groups gives bitwise the plain gradients, "
      "prefetching ahead") {
    DeterministicCuda deterministic;
    const int64_t layers = 4;
    CudaMlp mlp(layers);
    auto x = torch::randn({64, 256}, torch::TensorOptions().device(kCuda).requires_grad(true));
    const auto leaves = with(mlp.params(), x);
    const auto plain = rt::grads_of([&] { return mlp.forward(x).sum(); }, leaves);
    REQUIRE(plain.back().is_cuda());
    const auto activation_bytes =
        static_cast<int64_t>(x.nbytes());  // every ReLU output is 64 x 256

    for (int64_t lookahead : {0, 1}) {
      CAPTURE(lookahead);
      auto manager = test_manager(lookahead);
      torch::Tensor loss;
      {
        recompose::AsyncSaveOnCpu offload(manager);
        loss = mlp.forward(x, manager.get()).sum();  // sum saves nothing: every save is in a group
      }
      // Copies to pinned host memory run on a side stream; wait for them so that every tensor is
      // in host memory only (device copies dropped) and backward must reload each of them.
      manager->synchronize();
      auto s = manager->stats();
      CHECK(s.groups == layers);
      // Each ReLU output is saved by ReLU and by the next Linear: one copy, shared.
      CHECK(s.tensors_offloaded == layers);
      CHECK(s.shared_offloads == layers - 1);
      CHECK(s.bytes_offloaded == layers * activation_bytes);
      CHECK(s.tensors_kept > 0);  // x (a leaf requiring grad) and the weights stay on the device
      CHECK(s.tensors_reloaded == 0);
      CHECK(manager->tensors_alive() == layers);
      CHECK(manager->bytes_alive() == s.bytes_offloaded);

      for (auto& t : leaves) t.mutable_grad() = torch::Tensor();
      loss.backward();
      loss = torch::Tensor();
      std::vector<torch::Tensor> swapped;
      for (const auto& t : leaves) swapped.push_back(t.grad());
      CHECK(rt::bitwise_equal(plain, swapped));

      s = manager->stats();
      CHECK(s.early_returns == 0);  // nothing was still in flight to the host
      CHECK(s.tensors_reloaded == layers);
      CHECK(s.bytes_reloaded == s.bytes_offloaded);
      // Backward reaches the last group first and loads it on demand; with a lookahead of one
      // group, each group's first use launched the reload of the group before it.
      CHECK(s.sync_loads == (lookahead == 0 ? layers : 1));
      CHECK(s.prefetched == (lookahead == 0 ? 0 : layers - 1));
      CHECK(manager->tensors_alive() == 0);
      CHECK(manager->pool_bytes() == s.bytes_offloaded);  // pinned buffers kept for the next step
    }
  }

#ifdef RECOMPOSE_WITH_CUDA
  TEST_CASE("cuda swap: max_groups_in_flight frees offloaded device memory while forward runs") {
    // Eight layers of sin on 64 MiB: each saves its input. A sin takes microseconds, a 64 MiB copy
    // to host about a millisecond, so forward outruns the link: without the bound every saved
    // input is still on the device (in flight) when forward ends.
    namespace alloc = c10::cuda::CUDACachingAllocator;
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t layers = 8, numel = int64_t{16} << 20, bytes = numel * 4;
    auto x0 = torch::randn({numel}, torch::TensorOptions().device(kCuda).requires_grad(true));
    auto forward = [&](recompose::SwapManager* manager) {
      auto x = x0 * 2.0;  // not a leaf: offloadable
      for (int64_t i = 0; i < layers; ++i) {
        std::optional<recompose::SwapGroupScope> group;
        if (manager) group.emplace(*manager);
        x = torch::sin(x);
      }
      return x.sum();
    };
    const auto plain = torch::autograd::grad({forward(nullptr)}, {x0})[0];
    auto run = [&](int64_t limit) {
      auto manager = recompose::SwapManager::create(
          recompose::SwapOptions().min_bytes(0).max_groups_in_flight(limit));
      {
        // A first step fills the pinned pool: allocating pinned memory synchronises the device,
        // which would land every copy before the next offload.
        torch::Tensor warm_up;
        {
          recompose::AsyncSaveOnCpu offload(manager);
          warm_up = forward(manager.get());
        }
        torch::autograd::grad({warm_up}, {x0});
        manager->synchronize();
        manager->reset_stats();
      }
      torch::cuda::synchronize();
      const auto dev = x0.device().index();
      alloc::resetPeakStats(dev);
      const int64_t before = alloc::getDeviceStats(dev).allocated_bytes[all].current;
      torch::Tensor loss;
      {
        recompose::AsyncSaveOnCpu offload(manager);
        loss = forward(manager.get());
      }
      const int64_t forward_peak = alloc::getDeviceStats(dev).allocated_bytes[all].peak - before;
      const auto grad = torch::autograd::grad({loss}, {x0})[0];
      return std::make_tuple(forward_peak, grad, manager->stats());
    };
    const auto [unbounded_peak, unbounded_grad, unbounded_stats] = run(0);
    const auto [bounded_peak, bounded_grad, bounded_stats] = run(1);
    CAPTURE(unbounded_peak / bytes);
    CAPTURE(bounded_peak / bytes);
    CHECK(unbounded_stats.offload_waits == 0);
    CHECK(bounded_stats.offload_waits > 0);
    CHECK(bounded_stats.tensors_offloaded == layers);
    // Unbounded: the inputs of (nearly) every layer are still held when forward ends.
    CHECK(unbounded_peak >= (layers - 1) * bytes);
    // At most the current group and one older group in flight, plus the layer's input and output.
    CHECK(bounded_peak <= 5 * bytes);
    CHECK(torch::equal(plain, unbounded_grad));
    CHECK(torch::equal(plain, bounded_grad));
  }
#endif

  TEST_CASE("cuda swap: the next step reuses the pinned buffers and gives the same gradients") {
    DeterministicCuda deterministic;
    CudaMlp mlp(3);
    auto x = torch::randn({32, 256}, torch::TensorOptions().device(kCuda).requires_grad(true));
    const auto leaves = with(mlp.params(), x);
    auto manager = test_manager();
    auto step = [&] {
      return rt::grads_of(
          [&] {
            recompose::AsyncSaveOnCpu offload(manager);
            return mlp.forward(x, manager.get()).sum();
          },
          leaves);
    };
    const auto first = step();
    manager->synchronize();  // the first step's reloads have landed: its buffers are free again
    const auto misses = manager->stats().pool_misses;
    CHECK(misses == 3);
    const auto second = step();
    CHECK(rt::bitwise_equal(first, second));
    CHECK(manager->stats().pool_misses == misses);
    CHECK(manager->stats().pool_hits == 3);
  }

  TEST_CASE("cuda swap: swap_inputs keeps a checkpointed region's CUDA input in host memory") {
    DeterministicCuda deterministic;
    CudaMlp mlp(2);
    auto x = torch::randn({64, 256}, torch::TensorOptions().device(kCuda).requires_grad(true));
    const auto leaves = with(mlp.params(), x);
    auto body = [&](const torch::Tensor& in) { return mlp.forward(in); };
    const auto none = rt::grads_of([&] { return body(x * 2).sum(); }, leaves);
    // The region's input is an activation (x * 2), not a leaf: eligible.
    const auto ckpt =
        rt::grads_of([&] { return recompose::checkpoint(body, x * 2).sum(); }, leaves);
    auto manager = test_manager();
    const auto swapped = rt::grads_of(
        [&] {
          auto out = recompose::checkpoint(
              recompose::CheckpointOptions().swap_inputs(true).swap_manager(manager), body, x * 2);
          CHECK(manager->stats().tensors_offloaded == 1);
          CHECK(manager->stats().bytes_offloaded == static_cast<int64_t>(x.nbytes()));
          return out.sum();
        },
        leaves);
    CHECK(rt::bitwise_equal(none, ckpt));
    CHECK(rt::bitwise_equal(ckpt, swapped));
    CHECK(manager->stats().tensors_reloaded + manager->stats().early_returns == 1);
    CHECK(manager->stats().bytes_reloaded <= manager->stats().bytes_offloaded);
    CHECK(manager->tensors_alive() == 0);
  }

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  TEST_CASE("cuda swap: MUST_SWAP sends the matrix products to host memory and replays them") {
    DeterministicCuda deterministic;
    auto swap_mm =
        recompose::SelectivePolicy([](const recompose::SelectiveCheckpointContext&,
                                      const c10::OperatorHandle& op, const torch::jit::Stack&) {
          return op.schema().name() == "aten::mm" ? recompose::CheckpointPolicy::MUST_SWAP
                                                  : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
        });
    OpCounter none_bwd;
    const auto none = mm_grads([](const MmLeaves& l) { return mm_body(l.a, l.b, l.c); }, none_bwd);
    auto manager = test_manager();
    auto options = recompose::CheckpointOptions().swap_manager(manager);
    options.policy(swap_mm);
    OpCounter bwd;
    const auto got = mm_grads(
        [&](const MmLeaves& l) {
          auto out = recompose::checkpoint(options, mm_body, l.a, l.b, l.c);
          CHECK(manager->stats().tensors_offloaded == 2);
          CHECK(manager->stats().bytes_offloaded == (64 * 96 + 64 * 80) * 4);
          return out;
        },
        bwd);
    CHECK(rt::bitwise_equal(got, none));
    // The recomputation replayed both products from their reloaded copies: backward ran only its
    // own matrix products.
    CHECK(bwd["aten::mm"] == none_bwd["aten::mm"]);
    CHECK(manager->stats().tensors_reloaded + manager->stats().early_returns == 2);
    CHECK(manager->tensors_alive() == 0);
  }
#endif  // RECOMPOSE_TEST_NO_SELECTIVE
#endif  // RECOMPOSE_TEST_NO_SWAP

  // ---- CUDA generator across the recomputation -------------------------------------------------

  TEST_CASE(
      "cuda RNG: dropout in checkpoint draws the forward's mask again; the generator ends where it "
      "would") {
    DeterministicCuda deterministic;
    auto x = torch::randn({4096}, torch::TensorOptions().device(kCuda).requires_grad(true));
    auto body = [](const torch::Tensor& t) {
      return torch::dropout(t.sin(), 0.5, /*train=*/true).cos();
    };
    torch::manual_seed(7);  // seeds the CUDA generators too
    const auto plain = rt::grads_of([&] { return body(x).sum(); }, {x});
    const auto plain_state = cuda_generator_state();

    torch::manual_seed(7);
    const auto ckpt = rt::grads_of([&] { return recompose::checkpoint(body, x).sum(); }, {x});
    CHECK(rt::bitwise_equal(plain, ckpt));
    CHECK(torch::equal(cuda_generator_state(), plain_state));

    // Without preserving the state the recomputation draws another mask: the case can tell.
    torch::manual_seed(7);
    const auto unpreserved = rt::grads_of(
        [&] {
          return recompose::checkpoint(recompose::CheckpointOptions().preserve_rng_state(false),
                                       body, x)
              .sum();
        },
        {x});
    CHECK_FALSE(rt::bitwise_equal(plain, unpreserved));
    CHECK_FALSE(torch::equal(cuda_generator_state(), plain_state));
  }

  TEST_CASE(
      "cuda RNG: apply_checkpoint on blocks with dropout gives the plain gradients and generator "
      "state") {
    DeterministicCuda deterministic;
    auto make = [] {
      torch::manual_seed(11);
      std::vector<DropoutBlock> blocks{DropoutBlock(128), DropoutBlock(128), DropoutBlock(128)};
      for (auto& b : blocks) b->to(kCuda);
      return blocks;
    };
    auto params = [](std::vector<DropoutBlock>& blocks) {
      std::vector<torch::Tensor> out;
      for (auto& b : blocks) {
        for (auto& p : b->parameters()) out.push_back(p);
      }
      return out;
    };
    auto x = torch::randn({32, 128}, torch::TensorOptions().device(kCuda).requires_grad(true));
    auto run = [&](std::vector<DropoutBlock>& blocks) {
      torch::manual_seed(12);
      const auto g = rt::grads_of([&] { return blocks[2](blocks[1](blocks[0](x))).square().sum(); },
                                  with(params(blocks), x));
      return std::make_pair(g, cuda_generator_state());
    };
    auto plain_blocks = make();
    const auto [plain, plain_state] = run(plain_blocks);
    auto blocks = make();
    for (auto& b : blocks) recompose::apply_checkpoint(b);
    const auto [ckpt, ckpt_state] = run(blocks);
    CHECK(rt::bitwise_equal(plain, ckpt));
    CHECK(torch::equal(ckpt_state, plain_state));
  }

  // ---- CUDA autocast -------------------------------------------------------------------------

  TEST_CASE("cuda autocast: a bf16 region recomputes under the forward's autocast state") {
    DeterministicCuda deterministic;
    torch::manual_seed(8);
    auto opts = torch::TensorOptions().device(kCuda).requires_grad(true);
    torch::Tensor x = torch::randn({64, 128}, opts);
    torch::Tensor w = torch::randn({128, 128}, opts);
    auto body = [&w](const torch::Tensor& t) {
      torch::Tensor h = t.matmul(w);
      const bool bf16 = h.scalar_type() == torch::kBFloat16;
      CHECK(bf16);  // autocast is on here, also in the recomputation
      return h.relu().to(torch::kFloat);
    };
    // Autocast only around the forward: backward (and so the recomputation) runs with it off.
    auto under_autocast = [](auto fn) {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      auto out = fn();
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      return out;
    };
    const auto plain =
        rt::grads_of([&] { return under_autocast([&] { return body(x); }).sum(); }, {x, w});
    const auto ckpt = rt::grads_of(
        [&] { return under_autocast([&] { return recompose::checkpoint(body, x); }).sum(); },
        {x, w});
    CHECK(rt::bitwise_equal(plain, ckpt));
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
    for (const std::string op : {"aten::mm", "aten::_to_copy"}) {
      CAPTURE(op);
      const auto options = recompose::CheckpointOptions().policy(
          recompose::SelectivePolicy(std::vector<std::string>{op}));
      const auto sac = rt::grads_of(
          [&] {
            return under_autocast([&] { return recompose::checkpoint(options, body, x); }).sum();
          },
          {x, w});
      CHECK(rt::bitwise_equal(plain, sac));
    }
#endif
  }

  // ---- Selective policies on CUDA -----------------------------------------------------------

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  TEST_CASE(
      "cuda selective: native_dropout's kept mask and the kept weight casts rebuild the block "
      "bitwise") {
    // Dropout on CUDA is aten::native_dropout: its mask is kept where the replay needs it alone
    // (lib/selective/dropout_draw.h); under bf16 autocast the weights' casts are kept
    // (parameter_casts.h). Gradients and the CUDA generator as without checkpointing.
    DeterministicCuda deterministic;
    torch::manual_seed(21);
    // The input requires no grad: autocast's cast of a leaf that requires grad counts as a
    // parameter's.
    const torch::Tensor x = torch::randn({4, 16, 64}, torch::TensorOptions().device(kCuda));
    const torch::Tensor w1 = (torch::randn({256, 64}) * 0.1).to(kCuda).requires_grad_(true);
    const torch::Tensor w2 = (torch::randn({64, 256}) * 0.1).to(kCuda).requires_grad_(true);
    auto body = [&](const torch::Tensor& t) {
      auto r = t + torch::dropout(torch::linear(torch::gelu(torch::linear(t, w1)), w2), 0.2, true);
      return (r + torch::dropout(torch::layer_norm(r, {64}), 0.3, true)).to(torch::kFloat);
    };
    const auto policy = recompose::transformer_policy(
        recompose::TransformerPolicyOptions().parameter_cast_budget(1e6));
    for (const bool bf16 : {false, true}) {
      CAPTURE(bf16);
      auto step = [&](bool checkpointed) {
        torch::manual_seed(22);
        const auto grads = rt::grads_of(
            [&] {
              at::autocast::set_autocast_enabled(at::kCUDA, bf16);
              at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
              auto y = checkpointed ? recompose::checkpoint(
                                          recompose::CheckpointOptions().policy(policy), body, x)
                                    : body(x);
              at::autocast::set_autocast_enabled(at::kCUDA, false);
              at::autocast::clear_cache();
              return y.square().sum();
            },
            {w1, w2});
        return std::make_pair(grads, cuda_generator_state());
      };
      const auto [plain, plain_state] = step(false);
      recompose::reset_selective_replay_stats();
      const auto [ckpt, ckpt_state] = step(true);
      const auto stats = recompose::selective_replay_stats();
      CHECK(rt::bitwise_equal(plain, ckpt));
      CHECK(torch::equal(ckpt_state, plain_state));
      CHECK(stats.replayed == 1);
      CHECK(stats.fallbacks == 0);
      // The second dropout's mask alone is needed: kept, nothing run for it. The first's output
      // feeds the layer norm: its mask is released and native_dropout runs again, as before.
      CHECK(stats.draws_written == 1);
      CHECK(stats.casts_kept == (bf16 ? 2 : 0));
    }
  }

  TEST_CASE(
      "cuda selective: saving mm and recomputing the rest gives the plain gradients, without "
      "rerunning mm") {
    DeterministicCuda deterministic;
    const auto save_mm =
        recompose::CheckpointOptions().policy(recompose::SelectivePolicy({"aten::mm"}));
    const auto recompute_all = recompose::CheckpointOptions().policy(recompose::SelectivePolicy(
        [](const recompose::SelectiveCheckpointContext&, const c10::OperatorHandle&,
           const torch::jit::Stack&) { return recompose::CheckpointPolicy::PREFER_RECOMPUTE; }));
    const auto plain = [](const MmLeaves& l) { return mm_body(l.a, l.b, l.c); };
    const auto full = [](const MmLeaves& l) {
      return recompose::checkpoint(mm_body, l.a, l.b, l.c);
    };
    const auto sac = [&](const MmLeaves& l) {
      return recompose::checkpoint(save_mm, mm_body, l.a, l.b, l.c);
    };
    const auto recomputed = [&](const MmLeaves& l) {
      return recompose::checkpoint(recompute_all, mm_body, l.a, l.b, l.c);
    };
    OpCounter none_bwd, full_bwd;
    const auto none = mm_grads(plain, none_bwd);
    REQUIRE(none[0].is_cuda());
    CHECK(rt::bitwise_equal(none, mm_grads(full, full_bwd)));
    // Full checkpointing reruns both products.
    CHECK(full_bwd["aten::mm"] == none_bwd["aten::mm"] + 2);

    SUBCASE("replayed (the default): the replay runs sin again, never mm under save_mm") {
      // The replay's ops reach no interceptor: count them through RecordFunction.
      auto calls_in_backward = [](const std::function<torch::Tensor(const MmLeaves&)>& run,
                                  const char* op, std::vector<torch::Tensor>* grads) {
        const MmLeaves l = MmLeaves::make();
        torch::Tensor loss = run(l).square().sum();
        rt::OpCallCounter counter(op);
        loss.backward();
        if (grads) {
          for (const auto& t : l.all()) grads->push_back(t.grad());
        }
        return counter.calls();
      };
      recompose::reset_selective_replay_stats();
      std::vector<torch::Tensor> sac_grads, recomputed_grads;
      const int64_t sac_mm = calls_in_backward(sac, "aten::mm", &sac_grads);
      const int64_t recomputed_mm = calls_in_backward(recomputed, "aten::mm", &recomputed_grads);
      const auto stats = recompose::selective_replay_stats();
      CHECK(stats.replayed == 2);
      CHECK(stats.fallbacks == 0);
      CHECK(rt::bitwise_equal(none, sac_grads));
      CHECK(rt::bitwise_equal(none, recomputed_grads));
      const int64_t none_mm = calls_in_backward(plain, "aten::mm", nullptr);
      const int64_t full_mm = calls_in_backward(full, "aten::mm", nullptr);
      CHECK(none_mm > 0);
      CHECK(full_mm > none_mm);
      CHECK(sac_mm == none_mm);         // saving mm: neither product runs again
      CHECK(recomputed_mm == full_mm);  // recomputing everything: both do, as in full
      CHECK(calls_in_backward(plain, "aten::sin", nullptr) == 0);
      CHECK(calls_in_backward(sac, "aten::sin", nullptr) > 0);  // sin is recomputed
    }
    SUBCASE("rerun (replay off): the region's forward runs again, and so do its ops") {
      recompose::set_selective_replay_enabled(false);
      struct On {
        ~On() { recompose::set_selective_replay_enabled(true); }
      } on;
      OpCounter sac_bwd, recompute_bwd;
      CHECK(rt::bitwise_equal(none, mm_grads(sac, sac_bwd)));
      CHECK(rt::bitwise_equal(none, mm_grads(recomputed, recompute_bwd)));
      CHECK(recompute_bwd["aten::mm"] == none_bwd["aten::mm"] + 2);
      CHECK(sac_bwd["aten::mm"] == none_bwd["aten::mm"]);
      CHECK(sac_bwd["aten::sin"] == none_bwd["aten::sin"] + 1);
    }
  }

  TEST_CASE(
      "cuda selective: transformer_policy on checkpointed CUDA blocks gives the plain gradients") {
    DeterministicCuda deterministic;
    auto make = [] {
      torch::manual_seed(13);
      std::vector<DropoutBlock> blocks{DropoutBlock(128), DropoutBlock(128)};
      for (auto& b : blocks) b->to(kCuda);
      return blocks;
    };
    auto x = torch::randn({16, 128}, torch::TensorOptions().device(kCuda));
    auto grads = [&](std::vector<DropoutBlock>& blocks) {
      std::vector<torch::Tensor> ps;
      for (auto& b : blocks) {
        for (auto& p : b->parameters()) ps.push_back(p);
      }
      torch::manual_seed(14);
      return rt::grads_of([&] { return blocks[1](blocks[0](x)).square().sum(); }, ps);
    };
    auto plain_blocks = make();
    const auto plain = grads(plain_blocks);
    auto blocks = make();
    // Dropout is random: the policy keeps the matrix products, the recomputation redraws the mask
    // from the restored CUDA generator.
    for (auto& b : blocks) {
      recompose::apply_checkpoint(
          b, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
    }
    CHECK(rt::bitwise_equal(plain, grads(blocks)));
  }
#endif  // RECOMPOSE_TEST_NO_SELECTIVE

  TEST_CASE(
      "cuda GraphExecGroup: backward calls on the CUDA device thread share one recomputation") {
    DeterministicCuda deterministic;
    // CUDA backward unpacks on the device's autograd thread: the group is found there through the
    // graph task.
    rt::check_backward_calls_share_one_recomputation(
        torch::randn({64}, torch::TensorOptions().device(kCuda).requires_grad(true)));
  }

#ifndef RECOMPOSE_TEST_NO_PLANNER
  // Three dropout blocks under a root, as the planner profiles them.
  struct PlannedNetImpl : torch::nn::Module {
    PlannedNetImpl() {
      list = register_module("blocks", torch::nn::ModuleList());
      for (int i = 0; i < 3; ++i) {
        blocks.emplace_back(256);
        list->push_back(blocks.back());
      }
    }
    torch::Tensor forward(torch::Tensor x) {
      for (auto& b : blocks) x = b(x);
      return x;
    }
    torch::nn::ModuleList list{nullptr};
    std::vector<DropoutBlock> blocks;
  };
  TORCH_MODULE(PlannedNet);

  TEST_CASE(
      "cuda planner: the profile times the device's work from events; a plan gives the plain "
      "gradients") {
    DeterministicCuda deterministic;
    auto make = [] {
      torch::manual_seed(21);
      PlannedNet net;
      net->to(kCuda);
      return net;
    };
    auto x = torch::randn({512, 256}, torch::TensorOptions().device(kCuda));
    auto loss_of = [&](PlannedNet& net) { return net(x).square().mean(); };
    auto grads = [&](PlannedNet& net) {
      torch::manual_seed(22);
      return rt::grads_of([&] { return loss_of(net); }, net->parameters());
    };
    auto plain_net = make();
    const auto plain = grads(plain_net);

    auto net = make();
    const auto generator_before = cuda_generator_state();
    const auto profile = recompose::profile_memory(*net, [&] { loss_of(net).backward(); });
    // Profiling draws nothing from the generator and leaves no hook behind.
    CHECK(torch::equal(generator_before, cuda_generator_state()));
    net->zero_grad();
    CHECK(profile.device == "cuda:0");
    CHECK(profile.copy_bandwidth > 1e8);  // bytes/s: any PCIe or NVLink link does more
    CHECK(profile.step_seconds > 0);
    REQUIRE(profile.modules.size() == 3);
    for (const auto& m : profile.modules) {
      CHECK(m.forward_seconds > 0);
      CHECK(m.selective_forward_seconds > 0);
      CHECK(m.replay_seconds > 0);
      // Seconds, not milliseconds: a block is a small part of the step.
      CHECK(m.forward_seconds < profile.step_seconds);
      // The ops' spans lie inside their module's span and do not overlap.
      double ops = 0;
      for (const auto& o : m.ops) {
        CHECK(o.seconds >= 0);
        ops += o.seconds;
      }
      CHECK(ops <= m.selective_forward_seconds * 1.0001 + 1e-7);
      CHECK(!m.ops.empty());
    }

    const auto plan = recompose::solve_plan(profile, recompose::Budget::fraction(0.5));
    CHECK(plan.bytes <= plan.budget_bytes);
    recompose::apply_plan(*net, plan);
    CHECK(rt::bitwise_equal(plain, grads(net)));
  }

  TEST_CASE(
      "cuda planner: resident_bytes counts the model once (profiling keeps its copy in host "
      "memory)") {
    // 64 MiB of weights and tiny activations: the device holds the weights and their gradients
    // beside the activations; a second copy of the model on the device would add 64 MiB more.
    PlannedNet net;
    auto big = net->register_parameter("big", torch::zeros({4096, 4096}));
    net->to(kCuda);
    auto x = torch::randn({8, 256}, torch::TensorOptions().device(kCuda));
    int64_t model_bytes = 0;
    for (const auto& p : net->parameters()) model_bytes += p.numel() * p.element_size();
    const auto profile = recompose::profile_memory(
        *net, [&] { (net(x).square().mean() + net->named_parameters()["big"].sum()).backward(); });
    INFO("resident " << profile.resident_bytes << " B, model " << model_bytes << " B");
    CHECK(profile.resident_bytes >= 2 * model_bytes);  // weights and gradients
    CHECK(profile.resident_bytes < 2 * model_bytes + model_bytes / 2);
    net->zero_grad();
  }
#endif  // RECOMPOSE_TEST_NO_PLANNER

#ifdef RECOMPOSE_WITH_CUDA
  // ---- memory_viz snapshot ----------------------------------------------------------------------

  TEST_CASE(
      "cuda memory_viz snapshot: the caching allocator's trace carries recompose's decisions") {
    torch::manual_seed(3);
    DropoutBlock first(256), second(256);
    first->to(kCuda);
    second->to(kCuda);
    recompose::apply_checkpoint(*first);
    recompose::apply_checkpoint(*second);
    const auto x = torch::randn({64, 256}, torch::TensorOptions().device(kCuda));
    recompose::record_memory_history(true, recompose::MemoryHistoryOptions().device(kCuda));
    second(first(x)).sum().backward();
    torch::cuda::synchronize();
    recompose::record_memory_history(false);
    const std::string bytes = recompose::memory_snapshot();
    const auto snapshot = torch::jit::unpickle(bytes.data(), bytes.size()).toGenericDict();
    CHECK(snapshot.contains("segments"));
    const auto traces = snapshot.at("device_traces").toList();
    REQUIRE(traces.size() >= 1);
    std::vector<std::string> metadata;
    for (const c10::IValue& e : traces.get(0).toList()) {
      const auto entry = e.toGenericDict();
      if (entry.at("action").toStringRef() == "alloc")
        metadata.push_back(entry.at("user_metadata").toStringRef());
    }
    auto any = [&](const std::string& prefix) {
      return std::any_of(metadata.begin(), metadata.end(),
                         [&](const std::string& m) { return m.rfind(prefix, 0) == 0; });
    };
    // Each block's forward and its rerun in backward (full regions), as the user metadata.
    CHECK(any("forward: #1 "));
    CHECK(any("forward: #2 "));
    CHECK(any("rerun: #1 "));
    CHECK(any("rerun: #2 "));
    // Allocations outside any region (the loss, the gradients) have none.
    CHECK(std::count(metadata.begin(), metadata.end(), std::string()) > 0);
    recompose::record_memory_history(false, recompose::MemoryHistoryOptions().clear_history(true));
  }
#endif  // RECOMPOSE_WITH_CUDA

}  // TEST_SUITE
