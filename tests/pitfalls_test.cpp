// The pitfalls users of other checkpointing libraries report, kept as tests (issue 48, item 3).
// Each case cites the report it guards and compares against plain training bitwise (output, loss,
// every gradient, every buffer; parameters after an optimizer step where there is one), and checks
// the bytes held for backward (SavedTensorMeter, the step ledger, the swap manager's counts)
// against a count made here: the byte sizes of the tensors the case expects to be held. CPU only.
#include "support/grad_check.h"
#include "support/selective_helpers.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/device_memory.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>
#include <recompose/planner.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {
namespace pitfall {  // names of their own: this file shares a unity group with the ledger tests

using recompose::CheckpointOptions;
using recompose::CheckpointPolicy;
using recompose::SelectiveCheckpointContext;
using recompose::SelectivePolicy;

constexpr int64_t kRows = 6;                           // batch
constexpr int64_t kIn = 8;                             // a block's input and output width
constexpr int64_t kHidden = 12;                        // its inner width
constexpr int64_t kInBytes = kRows * kIn * 4;          // one float [kRows, kIn] tensor
constexpr int64_t kHiddenBytes = kRows * kHidden * 4;  // one float [kRows, kHidden] tensor

// The bytes of the distinct storages of `tensors`, as a SavedTensorMeter counts what it holds:
// each storage once, leaves that require grad not at all.
int64_t distinct_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || (t.is_leaf() && t.requires_grad())) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

// After one step: output, loss, the input's gradient, every parameter's gradient, every buffer.
std::vector<torch::Tensor> state_after(torch::nn::Module& m, const torch::Tensor& out,
                                       const torch::Tensor& loss, const torch::Tensor& x) {
  std::vector<torch::Tensor> v = {out.detach().clone(), loss.detach().clone(), x.grad().clone()};
  for (const auto& p : m.named_parameters()) {
    v.push_back(p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor());
  }
  for (const auto& b : m.named_buffers()) v.push_back(b.value().clone());
  return v;
}

std::vector<torch::Tensor> parameters_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
  return v;
}

// A transformer-like block with three matrix products, an odd number (an addmm, fc1 on a 2-d
// input, and two mm), a batch norm (buffers written once per call) and a residual:
//   h = fc1(x) [addmm]; g = mm(tanh(bn(h)), w2) [mm 0]; o = mm(sin(g), w3) [mm 1]; x + o.
struct PitfallBlockImpl : torch::nn::Module {
  PitfallBlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(kHidden));
    w2 = register_parameter("w2", torch::randn({kHidden, kHidden}) * 0.3);
    w3 = register_parameter("w3", torch::randn({kHidden, kIn}) * 0.3);
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    const torch::Tensor g = torch::mm(torch::tanh(bn(fc1(x))), w2);
    return x + torch::mm(torch::sin(g), w3);
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor w2, w3;
};
TORCH_MODULE(PitfallBlock);

// The bytes of the output of the block's j-th matrix product (addmm, mm 0, mm 1).
constexpr int64_t kMatmulBytes[3] = {kHiddenBytes, kHiddenBytes, kInBytes};

// Calls one block `calls` times in a loop (shared weights, a looped transformer); each call's
// input is recorded, outside the regions.
struct LoopNetImpl : torch::nn::Module {
  explicit LoopNetImpl(int64_t calls) : calls(calls) {
    torch::manual_seed(31);
    block = register_module("block", PitfallBlock());
  }
  torch::Tensor forward(torch::Tensor x) {
    inputs.clear();
    for (int64_t i = 0; i < calls; ++i) {
      inputs.push_back(x);
      x = block(x);
    }
    return x;
  }
  int64_t calls;
  PitfallBlock block{nullptr};
  std::vector<torch::Tensor> inputs;
};
TORCH_MODULE(LoopNet);

// `n` blocks of type B, one after the other (block i's output is block i+1's input); each
// block's input is recorded, outside the regions.
template <class B>
struct ChainImpl : torch::nn::Module {
  ChainImpl(int64_t n, uint64_t seed) {
    torch::manual_seed(seed);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < n; ++i) {
      list.emplace_back();
      blocks->push_back(list.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    inputs.clear();
    for (auto& b : list) {
      inputs.push_back(x);
      x = b(x);
    }
    return x;
  }
  torch::nn::ModuleList blocks{nullptr};
  std::vector<B> list;
  std::vector<torch::Tensor> inputs;
};

// The callable of NeMo-Automodel#2389: "recompute every second matmul" by a counter of the mm and
// addmm it is asked about, never reset, that does not look at is_recompute. Where a policy is
// asked again in the recomputation, an odd number of matmuls per region puts the counter out of
// phase there and the recomputation keeps other outputs than the forward did.
struct MatmulCounter {
  int64_t matmuls = 0;          // mm and addmm asked about
  int64_t asked = 0;            // every op asked about
  int64_t asked_recompute = 0;  // of those, with ctx.is_recompute set
};
SelectivePolicy every_second_matmul(const std::shared_ptr<MatmulCounter>& counter) {
  return SelectivePolicy([counter](const SelectiveCheckpointContext& ctx,
                                   const c10::OperatorHandle& op, const torch::jit::Stack&) {
    ++counter->asked;
    if (ctx.is_recompute) ++counter->asked_recompute;
    const std::string& name = op.schema().name();
    if (name != "aten::mm" && name != "aten::addmm") return CheckpointPolicy::PREFER_RECOMPUTE;
    return counter->matmuls++ % 2 == 0 ? CheckpointPolicy::MUST_SAVE
                                       : CheckpointPolicy::PREFER_RECOMPUTE;
  });
}

// A block whose first product is written in place, as the reports write it (pytorch#113737):
//   y = mm(x, w); y += b; relu_(y); z = mm(y, w2); sin(z).
// Saved for backward without checkpointing: x (mm), y after relu_ (relu_'s result, mm's input),
// z (sin's input); the weights are parameters.
struct InplaceBlockImpl : torch::nn::Module {
  InplaceBlockImpl() {
    w = register_parameter("w", torch::randn({kIn, kHidden}) * 0.3);
    b = register_parameter("b", torch::randn({kHidden}) * 0.1);
    w2 = register_parameter("w2", torch::randn({kHidden, kIn}) * 0.3);
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    torch::Tensor y = torch::mm(x, w);
    y.add_(b);
    y.relu_();
    return torch::sin(torch::mm(y, w2));
  }
  torch::Tensor w, b, w2;
};
TORCH_MODULE(InplaceBlock);

// The bytes of the products of an InplaceBlock a plan may keep, by (overload, call index): y and
// z. (sin's output, the block's own, is never kept by the solver: nothing in the block reads it.)
const std::map<std::pair<std::string, int64_t>, int64_t>& inplace_op_bytes() {
  static const std::map<std::pair<std::string, int64_t>, int64_t> bytes = {
      {{"aten::mm.default", 0}, kHiddenBytes}, {{"aten::mm.default", 1}, kInBytes}};
  return bytes;
}

// What one step measured and left.
struct Step {
  std::vector<torch::Tensor> state;   // state_after
  int64_t held = 0;                   // the meter's bytes when the forward ended
  int64_t held_after_backward = -1;   // and after backward
  std::vector<torch::Tensor> inputs;  // each block call's input
};

// One step of `net` on the same input every time, under a SavedTensorMeter; `before_backward`
// runs between the forward and the loss.
template <class Net>
Step step_of(Net& net, const std::function<void()>& before_backward = {}) {
  torch::manual_seed(5);
  const torch::Tensor leaf = torch::randn({kRows, kIn}, torch::requires_grad());
  Step s;
  recompose::SavedTensorMeter meter;
  const torch::Tensor out = net.forward(leaf * 1);  // not a leaf: block 0's input is held
  s.held = meter.bytes_held();
  s.inputs = net.inputs;
  if (before_backward) before_backward();
  const torch::Tensor loss = out.pow(2).sum();
  loss.backward();
  s.held_after_backward = meter.bytes_held();
  s.state = state_after(net, out, loss, leaf);
  net.inputs.clear();
  return s;
}

using InplaceChain = ChainImpl<InplaceBlock>;
std::shared_ptr<InplaceChain> make_inplace_chain(int64_t n) {
  return std::make_shared<InplaceChain>(n, 47);
}

// A step of a chain as step_of runs it, with a StepLedger and CPU memory counting beside the meter,
// read when the forward ended.
struct ChainStep {
  Step step;
  std::vector<recompose::LedgerRegion> rows;
  int64_t memory = 0;          // CPU memory allocated in the forward and still in use after it
  int64_t kept = 0;            // what selective_checkpoint_bytes_kept() grew by in the forward
  int64_t boundary_bytes = 0;  // distinct_bytes of the blocks' inputs and the chain's output
};
template <class Chain>
ChainStep chain_step(Chain& net) {
  torch::manual_seed(5);
  const torch::Tensor leaf = torch::randn({kRows, kIn}, torch::requires_grad());
  ChainStep c;
  recompose::StepLedger ledger(net);
  recompose::CpuMemoryCounting counting;
  const int64_t kept_before = recompose::selective_checkpoint_bytes_kept();
  recompose::SavedTensorMeter meter;
  const int64_t memory_before = recompose::current_device_memory(torch::kCPU);
  const torch::Tensor out = net.forward(leaf * 1);
  c.step.held = meter.bytes_held();
  c.memory = recompose::current_device_memory(torch::kCPU) - memory_before;
  c.kept = recompose::selective_checkpoint_bytes_kept() - kept_before;
  c.rows = ledger.regions();
  c.step.inputs = net.inputs;
  std::vector<torch::Tensor> boundaries = net.inputs;
  boundaries.push_back(out);
  c.boundary_bytes = distinct_bytes(boundaries);
  const torch::Tensor loss = out.pow(2).sum();
  loss.backward();
  c.step.held_after_backward = meter.bytes_held();
  c.step.state = state_after(net, out, loss, leaf);
  net.inputs.clear();
  return c;
}

}  // namespace pitfall
}  // namespace

TEST_SUITE("pitfalls of other libraries") {
  using namespace pitfall;

  TEST_CASE(
      "a block applied three times in one forward (shared weights): bitwise, and held bytes are "
      "its inputs and what each call keeps") {
    // pytorch#193193: a module called several times in one forward (a looped transformer, shared
    // weights) under checkpointing. Each call is a region of its own, with its own decisions, its
    // own kept outputs and its own recomputation; the batch norm's running statistics are updated
    // once per call, as without checkpointing.
    LoopNet plain_net(3);
    const Step plain = step_of(*plain_net);

    struct Case {
      const char* name;
      std::function<CheckpointOptions()> options;  // fresh per run: a policy may count
      int64_t kept_bytes;                          // what the three calls keep, from the shapes
    };
    // The stateful callable numbers the matmuls 0..8 over the three calls (global index 3 * call +
    // position): the even ones are kept, so call 0 keeps addmm and mm 1, call 1 keeps mm 0, call
    // 2 keeps addmm and mm 1.
    int64_t counter_kept = 0;
    for (int64_t k = 0; k < 9; ++k) counter_kept += k % 2 == 0 ? kMatmulBytes[k % 3] : 0;
    std::shared_ptr<MatmulCounter> counter;
    const std::vector<Case> cases = {
        {"full", [] { return CheckpointOptions(); }, 0},
        {"transformer_policy",
         [] { return CheckpointOptions().policy(recompose::transformer_policy()); },
         3 * (kMatmulBytes[0] + kMatmulBytes[1] + kMatmulBytes[2])},
        // recompute_every_second_mm counts aten::mm per call (call_index): mm 1 is recomputed.
        {"transformer_policy, every second mm",
         [] {
           return CheckpointOptions().policy(recompose::transformer_policy(
               recompose::TransformerPolicyOptions().recompute_every_second_mm(true)));
         },
         3 * (kMatmulBytes[0] + kMatmulBytes[1])},
        {"save list {aten::tanh}",
         [] { return CheckpointOptions().policy(SelectivePolicy({"aten::tanh"})); },
         3 * kHiddenBytes},
        {"stateful every second matmul",
         [&counter] {
           counter = std::make_shared<MatmulCounter>();
           return CheckpointOptions().policy(every_second_matmul(counter));
         },
         counter_kept},
    };
    for (const Case& c : cases) {
      for (const bool replay : {true, false}) {
        CAPTURE(c.name);
        CAPTURE(replay);
        rt::ReplaySwitch replay_switch(replay);
        LoopNet net(3);
        recompose::apply_checkpoint(net->block, c.options());
        recompose::reset_selective_replay_stats();
        const Step got = step_of(*net);
        const auto stats = recompose::selective_replay_stats();
        CHECK(rt::bitwise_equal(got.state, plain.state));
        // The block inputs (x0 = leaf * 1, and the first two calls' outputs), each once, and the
        // kept outputs.
        REQUIRE(got.inputs.size() == 3);
        CHECK(distinct_bytes(got.inputs) == 3 * kInBytes);
        CHECK(got.held == distinct_bytes(got.inputs) + c.kept_bytes);
        CHECK(got.held_after_backward == 0);
        const bool selective = std::string(c.name) != "full";
        CHECK(stats.replayed == (selective && replay ? 3 : 0));
        CHECK(stats.fallbacks == (selective && !replay ? 3 : 0));
        if (std::string(c.name) == "stateful every second matmul") {
          CHECK(counter->matmuls == 9);  // asked in the forward only: 3 calls x 3 matmuls
          CHECK(counter->asked_recompute == 0);
        }
      }
    }
  }

  TEST_CASE(
      "back-to-back checkpointed blocks hold each boundary once: block i's output is held once, "
      "as block i+1's input") {
    // Megatron's CheckpointWithoutOutput and MindSpore's output_recompute exist so that a
    // checkpointed block's output is not held twice (as its output and as the next block's
    // input). Under full checkpointing a region holds only its inputs: the boundaries, each once,
    // block i's row of the ledger holding block i's input.
    auto plain_net = make_inplace_chain(4);
    const Step plain = step_of(*plain_net);

    auto net = make_inplace_chain(4);
    for (auto& b : net->list) recompose::apply_checkpoint(b);
    const ChainStep full = chain_step(*net);
    CHECK(rt::bitwise_equal(full.step.state, plain.state));
    REQUIRE(full.step.inputs.size() == 4);
    CHECK(distinct_bytes(full.step.inputs) == 4 * kInBytes);
    CHECK(full.step.held == distinct_bytes(full.step.inputs));
    CHECK(full.step.held_after_backward == 0);
    REQUIRE(full.rows.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(full.rows[i].mode == recompose::LedgerMode::Full);
      CHECK(full.rows[i].bytes_held == distinct_bytes({full.step.inputs[i]}));
    }
    // The memory the forward left in use: the four boundaries and the output, once each.
    CHECK(full.boundary_bytes == 5 * kInBytes);
    CHECK(full.memory == full.boundary_bytes);

    // Selective, each block keeping its last op's output (sin's: the block's output, the next
    // block's input): the boundary is still one storage, in memory once. (What the meter and the
    // ledger count for it: the next test case.)
    auto sel = make_inplace_chain(4);
    for (auto& b : sel->list) {
      recompose::apply_checkpoint(b, CheckpointOptions().policy(SelectivePolicy({"aten::sin"})));
    }
    const ChainStep kept = chain_step(*sel);
    CHECK(rt::bitwise_equal(kept.step.state, plain.state));
    CHECK(kept.kept == 4 * kInBytes);  // selective_checkpoint_bytes_kept: per kept op output
    CHECK(kept.boundary_bytes == 5 * kInBytes);
    CHECK(kept.memory == kept.boundary_bytes);  // as under full checkpointing: nothing copied
    CHECK(kept.step.held_after_backward == 0);
  }

  // Found by this suite on a94e6c3 (issue 48, item 3): a kept output that is also the next
  // region's input was counted twice, by the SavedTensorMeter and by the step ledger, though it is
  // one storage, in memory once (1536 bytes, 384 a row, for 960): the cache entries charged a
  // byte count, which no storage of the meter's or the ledger's matched. They charge each storage
  // now (CacheEntry::account).
  TEST_CASE(
      "a kept output that is the next region's input is counted once by the meter and the ledger") {
    // Megatron's CheckpointWithoutOutput and MindSpore's output_recompute: the boundary held once.
    auto sel = make_inplace_chain(4);
    for (auto& b : sel->list) {
      recompose::apply_checkpoint(b, CheckpointOptions().policy(SelectivePolicy({"aten::sin"})));
    }
    const ChainStep kept = chain_step(*sel);
    REQUIRE(kept.boundary_bytes == 5 * kInBytes);
    REQUIRE(kept.memory == kept.boundary_bytes);
    CHECK(kept.step.held == kept.boundary_bytes);
    int64_t rows = 0;
    for (const auto& r : kept.rows) rows += r.bytes_held;
    CHECK(rows == kept.boundary_bytes);
    // Each storage in the first row holding it: block 0's row has its input and its kept output,
    // each later row only its kept output (its input is the row before's). Measured: 384 each.
    REQUIRE(kept.rows.size() == 4);
    CHECK(kept.rows[0].bytes_held == 2 * kInBytes);
    for (std::size_t i = 1; i < 4; ++i) CHECK(kept.rows[i].bytes_held == kInBytes);
  }

  TEST_CASE(
      "a stateful every-second-matmul policy over blocks with an odd number of matmuls: two SGD "
      "steps, bitwise") {
    // NeMo-Automodel#2389: a policy counting matmuls that does not tell the forward from the
    // recomputation corrupts the gradients when a block has an odd number of them (the count is
    // out of phase in the recomputation). Here the policy is asked in the forward only
    // (SelectiveCheckpointContext::is_recompute is always false; docs/guide/selective.md): the
    // recomputation replays the decisions recorded then, whether it replays the ops or runs the
    // forward again. The counter is never reset: 9 matmuls a step, so the second step's phase is
    // the other one.
    using Chain = ChainImpl<PitfallBlock>;
    auto make = [] { return std::make_shared<Chain>(3, 43); };
    auto train = [](Chain& net, const std::function<void(int)>& after_step) {
      torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.05));
      for (int step = 0; step < 2; ++step) {
        sgd.zero_grad();
        after_step(step);
        sgd.step();
      }
    };
    auto plain_net = make();
    std::vector<Step> plain;
    std::vector<std::vector<torch::Tensor>> plain_params;
    train(*plain_net, [&](int) {
      plain.push_back(step_of(*plain_net));
      plain_params.push_back(parameters_of(*plain_net));  // before this step's update
    });
    plain_params.push_back(parameters_of(*plain_net));

    for (const bool replay : {true, false}) {
      CAPTURE(replay);
      rt::ReplaySwitch replay_switch(replay);
      auto net = make();
      auto counter = std::make_shared<MatmulCounter>();
      for (auto& b : net->list) {
        recompose::apply_checkpoint(b, CheckpointOptions().policy(every_second_matmul(counter)));
      }
      train(*net, [&](int step) {
        CAPTURE(step);
        CHECK(rt::bitwise_equal(parameters_of(*net), plain_params[step]));
        recompose::reset_selective_replay_stats();
        int64_t after_forward = -1;
        const Step got = step_of(*net, [&] { after_forward = counter->matmuls; });
        CHECK(rt::bitwise_equal(got.state, plain[step].state));
        CHECK(after_forward == 9 * (step + 1));
        CHECK(counter->matmuls == after_forward);  // backward asked nothing
        CHECK(counter->asked_recompute == 0);
        const auto stats = recompose::selective_replay_stats();
        CHECK(stats.replayed == (replay ? 3 : 0));
        CHECK(stats.fallbacks == (replay ? 0 : 3));
        // Kept: the matmuls whose global index 9 * step + 3 * block + position is even.
        int64_t kept = 0;
        for (int64_t k = 0; k < 9; ++k) kept += (9 * step + k) % 2 == 0 ? kMatmulBytes[k % 3] : 0;
        CHECK(distinct_bytes(got.inputs) == 3 * kInBytes);
        CHECK(got.held == distinct_bytes(got.inputs) + kept);
        CHECK(got.held_after_backward == 0);
      });
      CHECK(rt::bitwise_equal(parameters_of(*net), plain_params[2]));
    }
  }

  TEST_CASE("in-place ops on a kept output inside a region: selective, bitwise, writes carried") {
    // pytorch#113737: y = mm(x, w) kept by the policy, then y += b and relu_(y) in the region.
    // The kept output carries both writes (it holds the value after them: no copy in the forward,
    // no write again in the replay), and the replay gives autograd's gradients.
    auto make = [] { return make_inplace_chain(2); };
    auto plain_net = make();
    const Step plain = step_of(*plain_net);
    for (const SelectivePolicy& policy :
         {SelectivePolicy({"aten::mm"}), recompose::transformer_policy()}) {
      for (const bool replay : {true, false}) {
        CAPTURE(replay);
        rt::ReplaySwitch replay_switch(replay);
        auto net = make();
        for (auto& b : net->list)
          recompose::apply_checkpoint(b, CheckpointOptions().policy(policy));
        recompose::reset_selective_replay_stats();
        const Step got = step_of(*net);
        const auto stats = recompose::selective_replay_stats();
        CHECK(rt::bitwise_equal(got.state, plain.state));
        // Each block keeps y (once, with the writes) and z; its input is held.
        CHECK(got.held == distinct_bytes(got.inputs) + 2 * (kHiddenBytes + kInBytes));
        CHECK(got.held_after_backward == 0);
        CHECK(stats.replayed == (replay ? 2 : 0));
        CHECK(stats.fallbacks == (replay ? 0 : 2));
        if (replay) CHECK(stats.writes_carried == 4);  // add_ and relu_, in each block
      }
    }
  }

  TEST_CASE("in-place ops on a kept output inside a region: under offload and swap, bitwise") {
    // pytorch#113737 with the saved tensors in host memory: y is written in place after mm made it
    // (and, under MUST_SWAP, after its copy to host was launched).
    auto make = [] { return make_inplace_chain(2); };
    auto plain_net = make();
    const Step plain = step_of(*plain_net);

    SUBCASE("apply_offload: every saved activation goes to host memory") {
      auto net = make();
      auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
      for (auto& b : net->list) {
        recompose::apply_offload(
            b, recompose::OffloadOptions().manager(manager).keep_last_on_device(false));
      }
      const recompose::SwapStats before = manager->stats();
      const Step got = step_of(*net);
      const recompose::SwapStats after = manager->stats();
      CHECK(rt::bitwise_equal(got.state, plain.state));
      CHECK(got.held == 0);  // nothing stayed on the device (the weights are parameters)
      // Each block's x, y (saved twice, by relu_ and mm: one copy) and z, copied once each.
      CHECK(after.bytes_offloaded - before.bytes_offloaded ==
            distinct_bytes(got.inputs) + 2 * (kHiddenBytes + kInBytes));
      CHECK(after.bytes_reloaded - before.bytes_reloaded ==
            after.bytes_offloaded - before.bytes_offloaded);
    }
    SUBCASE("MUST_SWAP of the products: y copied to host before the writes into it") {
      auto net = make();
      auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
      const SelectivePolicy swap_mm([](const SelectiveCheckpointContext&,
                                       const c10::OperatorHandle& op, const torch::jit::Stack&) {
        return op.schema().name() == "aten::mm" ? CheckpointPolicy::MUST_SWAP
                                                : CheckpointPolicy::PREFER_RECOMPUTE;
      });
      for (auto& b : net->list) {
        recompose::apply_checkpoint(b, CheckpointOptions().policy(swap_mm).swap_manager(manager));
      }
      const recompose::SwapStats before = manager->stats();
      recompose::reset_selective_replay_stats();
      const Step got = step_of(*net);
      const recompose::SwapStats after = manager->stats();
      CHECK(rt::bitwise_equal(got.state, plain.state));
      CHECK(got.held == distinct_bytes(got.inputs));  // the products are in host memory
      CHECK(after.bytes_offloaded - before.bytes_offloaded == 2 * (kHiddenBytes + kInBytes));
      CHECK(after.bytes_reloaded - before.bytes_reloaded ==
            after.bytes_offloaded - before.bytes_offloaded);
      CHECK(recompose::selective_replay_stats().fallbacks == 0);
    }
    SUBCASE("selective and apply_offload on one module: the inputs to host, y kept") {
      auto net = make();
      auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
      for (auto& b : net->list) {
        recompose::apply_checkpoint(b, CheckpointOptions().policy(SelectivePolicy({"aten::mm"})));
        recompose::apply_offload(
            b, recompose::OffloadOptions().manager(manager).keep_last_on_device(false));
      }
      const recompose::SwapStats before = manager->stats();
      const Step got = step_of(*net);
      const recompose::SwapStats after = manager->stats();
      CHECK(rt::bitwise_equal(got.state, plain.state));
      CHECK(got.held == 2 * (kHiddenBytes + kInBytes));  // y and z of each block
      CHECK(after.bytes_offloaded - before.bytes_offloaded == distinct_bytes(got.inputs));
    }
  }

  TEST_CASE("in-place ops on a kept output inside a region: under the planner, bitwise") {
    // pytorch#113737 through the planner: the profile sees y written in place after mm made it
    // (mutated, the writes carried), plans keep it, apply_plan applies them; each plan's step is
    // plain training's, bitwise, and holds what its choices say (the ledger's row as the plan's
    // estimate, the meter's total as the shapes give it).
    auto plain_net = make_inplace_chain(2);
    const Step plain = step_of(*plain_net);
    auto step = [](InplaceChain& net) {
      torch::manual_seed(5);
      const torch::Tensor leaf = torch::randn({kRows, kIn}, torch::requires_grad());
      net.forward(leaf * 1).pow(2).sum().backward();
    };
    auto profiled = make_inplace_chain(2);
    const recompose::MemoryProfile profile =
        recompose::profile_memory(*profiled, [&] { step(*profiled); });
    REQUIRE(profile.modules.size() == 2);
    for (const auto& m : profile.modules) {
      CAPTURE(m.name);
      REQUIRE(!m.ops.empty());
      CHECK(m.ops[0].op == "aten::mm.default");
      CHECK(m.ops[0].mutated);
      CHECK(m.ops[0].carries_write);
    }
    // What a module holds under its plan, from the shapes: its input, and the outputs it keeps
    // (selective) or what autograd saves (none: its input, y and z); nothing offloaded.
    auto expected_bytes = [](const recompose::ModulePlan& m, const torch::Tensor& input) {
      const int64_t in = distinct_bytes({input});
      switch (m.choice) {
        case recompose::ModuleChoice::None:
          return in + kHiddenBytes + kInBytes;
        case recompose::ModuleChoice::Full:
          return in;
        case recompose::ModuleChoice::Selective: {
          int64_t kept = in;
          for (const auto& op : m.save) {
            const auto it = inplace_op_bytes().find({op.op, op.call_index});
            if (it == inplace_op_bytes().end()) {
              FAIL_CHECK("a kept op this test does not know: " << op.op);
              continue;
            }
            kept += it->second;
          }
          return kept;
        }
        case recompose::ModuleChoice::Offload:
          return int64_t{0};
        default:
          FAIL_CHECK("a choice this test does not expect on CPU: "
                     << recompose::module_choice_name(m.choice));
          return int64_t{0};
      }
    };
    // One step under `plan`; `estimated`: the plan's estimates are the solver's (not a plan
    // edited by hand), and the ledger's rows must match them.
    auto check_plan = [&](const recompose::Plan& plan, bool estimated) {
      auto net = make_inplace_chain(2);
      recompose::apply_plan(*net, plan);
      recompose::StepLedger ledger(*net);
      const Step got = step_of(*net);
      CHECK(rt::bitwise_equal(got.state, plain.state));
      REQUIRE(got.inputs.size() == 2);
      const auto rows = ledger.regions();
      int64_t expected = 0;
      for (const auto& m : plan.modules) {
        CAPTURE(m.name);
        const std::size_t i = std::stoul(m.name.substr(m.name.rfind('.') + 1));
        const int64_t module_bytes = expected_bytes(m, got.inputs.at(i));
        expected += module_bytes;
        if (m.choice != recompose::ModuleChoice::Full &&
            m.choice != recompose::ModuleChoice::Selective)
          continue;
        const recompose::LedgerRegion* row = nullptr;
        for (const auto& r : rows) {
          if (r.name == m.name + " (" + m.type + ")") row = &r;
        }
        REQUIRE(row != nullptr);
        CHECK(row->bytes_held == module_bytes);
        if (estimated) CHECK(row->plan_bytes == row->bytes_held);
      }
      CHECK(got.held == expected);
      CHECK(got.held_after_backward == 0);
    };
    auto keeps_written_product = [](const recompose::Plan& plan) {
      for (const auto& m : plan.modules) {
        for (const auto& op : m.save) {
          if (m.choice == recompose::ModuleChoice::Selective && op.op == "aten::mm.default" &&
              op.call_index == 0)
            return true;
        }
      }
      return false;
    };

    SUBCASE("a plan written by hand: block 0 keeps both products, block 1 offloaded") {
      recompose::Plan plan = recompose::solve_plan(profile, recompose::Budget::fraction(1.0));
      REQUIRE(plan.modules.size() == 2);
      for (auto& m : plan.modules) {
        if (m.name == "blocks.0") {
          m.choice = recompose::ModuleChoice::Selective;
          m.save = {{"aten::mm.default", 0}, {"aten::mm.default", 1}};
        } else {
          m.choice = recompose::ModuleChoice::Offload;
        }
      }
      check_plan(plan, /*estimated=*/false);
    }
    SUBCASE("the solver's plans where the written product is expensive: they keep it") {
      // The profile as a model whose first product dominates its forward would give (1 s more):
      // keeping it (the in-place writes carried) is what the solver chooses between full
      // checkpointing and none.
      recompose::MemoryProfile costly = profile;
      for (auto& m : costly.modules) {
        for (auto& op : m.ops) {
          if (op.op == "aten::mm.default" && op.call_index == 0) {
            op.seconds += 1.0;
            m.forward_seconds += 1.0;
            m.selective_forward_seconds += 1.0;
          }
        }
      }
      const double least = static_cast<double>(recompose::min_plan_bytes(costly)) /
                           static_cast<double>(costly.bytes_held);
      int keeping = 0;
      for (int k = 0; k <= 6; ++k) {
        const double fraction = least + (1.0 - least) * k / 6;
        CAPTURE(fraction);
        const recompose::Plan plan =
            recompose::solve_plan(costly, recompose::Budget::fraction(fraction));
        keeping += keeps_written_product(plan) ? 1 : 0;
        check_plan(plan, /*estimated=*/true);
      }
      CHECK(keeping > 0);
    }
    SUBCASE("plan_memory's plans, as measured, from the least budget up") {
      const double least = static_cast<double>(recompose::min_plan_bytes(profile)) /
                           static_cast<double>(profile.bytes_held);
      for (int k = 0; k <= 4; ++k) {
        const double fraction = least + (1.0 - least) * k / 4;
        CAPTURE(fraction);
        auto net = make_inplace_chain(2);
        const recompose::Plan plan = recompose::plan_memory(
            *net, [&] { step(*net); }, recompose::Budget::fraction(fraction));
        check_plan(plan, /*estimated=*/true);
      }
    }
  }
}
