// inspect_policy: a region's ops as policies see them and what a policy did, with warnings when
// it keeps nothing or holds more than no checkpointing. The CNN example is the code of
// docs/guide/inspecting-policies.md.
#include "selective/policy_warnings.h"

#include <recompose/policy_report.h>
#include <recompose/recompose.h>

#include <c10/util/Exception.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

// [guide:block]
// A residual CNN block, as in a CIFAR ResNet.
struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(int64_t channels)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(channels))),
        conv2(register_module(
            "conv2", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(channels))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y)).flatten(1).view_as(x);
    return torch::relu(y + x);
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
};
TORCH_MODULE(ConvBlock);
// [/guide:block]

// Collects the warnings raised while it is alive.
struct WarningCollector : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
};

// Linear + ReLU: plain training keeps the narrow input and the wide ReLU output.
struct WideReluImpl : torch::nn::Module {
  WideReluImpl() : linear(register_module("linear", torch::nn::Linear(4, 64))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::relu(linear(x));
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(WideRelu);

int count_containing(const std::vector<std::string>& messages, const std::string& text) {
  int n = 0;
  for (const auto& m : messages) n += m.find(text) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

TEST_SUITE_BEGIN("policy report");

TEST_CASE(
    "inspect_policy: a CNN block's ops as policies see them, and what keeping aten::convolution "
    "does") {
  torch::manual_seed(0);
  ConvBlock block(4);
  torch::Tensor x = torch::randn({2, 4, 8, 8});
  const torch::Tensor running_mean = block->bn1->running_mean.clone();
  // [guide:inspect]
  recompose::PolicyReport report =
      recompose::inspect_policy(recompose::SelectivePolicy({"aten::convolution"}), block, x);
  std::cout << report;
  // [/guide:inspect]
  const int64_t conv_out_bytes = 2 * 4 * 8 * 8 * 4;
  std::vector<const recompose::PolicyReportOp*> convs;
  bool saw_hidden_view = false, saw_batch_norm = false;
  for (const auto& op : report.ops) {
    if (op.op == "aten::convolution.default") convs.push_back(&op);
    if (op.op.starts_with("aten::view") && !op.shown_to_policy)
      saw_hidden_view = op.why_hidden.find("view") != std::string::npos;
    if (op.op.find("batch_norm") != std::string::npos && op.shown_to_policy) saw_batch_norm = true;
  }
  REQUIRE(convs.size() == 2);
  for (int64_t i = 0; i < 2; ++i) {
    CHECK(convs[i]->call_index == i);
    CHECK(convs[i]->shown_to_policy);
    CHECK(convs[i]->kept());
    CHECK(convs[i]->output_bytes == conv_out_bytes);
  }
  CHECK(saw_hidden_view);
  CHECK(saw_batch_norm);
  CHECK(report.ops_kept == 2);
  CHECK(report.bytes_kept == 2 * conv_out_bytes);
  CHECK(report.ops_swapped == 0);
  CHECK(report.ops_recomputed == static_cast<int64_t>(report.ops.size()) - 2);
  CHECK(report.bytes_held_with_policy == 2 * conv_out_bytes);
  CHECK(report.bytes_held_without_checkpointing > report.bytes_held_with_policy);
  CHECK_FALSE(report.keeps_nothing());
  CHECK_FALSE(report.holds_more_than_no_checkpointing());
  const std::string text = report.to_string();
  CHECK(text.find("aten::convolution.default") != std::string::npos);
  CHECK(text.find("kept") != std::string::npos);
  CHECK(text.find("view, in-place or out= op") != std::string::npos);
  CHECK(text.find("warning") == std::string::npos);
  // Its training batch norms replay (with stand-in running statistics): no forward run again.
  CHECK(report.replay_fallback_reason.empty());
  CHECK(text.find("backward: the replay rebuilds what the policy dropped") != std::string::npos);
  // The module is left as found: BatchNorm's running statistics did not move.
  CHECK(torch::equal(block->bn1->running_mean, running_mean));
  CHECK(block->bn1->num_batches_tracked.item<int64_t>() == 0);
}

TEST_CASE(
    "inspect_policy leaves the RNG where it found it, and a dropout block draws the same in both "
    "runs") {
  torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::Dropout(0.5));
  torch::Tensor x = torch::randn({4, 8});
  torch::manual_seed(7);
  const torch::Tensor expected = torch::rand({3});
  torch::manual_seed(7);
  auto report = recompose::inspect_policy(recompose::SelectivePolicy({"aten::addmm"}), net, x);
  CHECK(torch::equal(torch::rand({3}), expected));
  CHECK(report.ops_kept == 1);
}

TEST_CASE("inspect_policy warns, once per region, when a policy keeps nothing") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  ConvBlock block(4);
  torch::Tensor x = torch::randn({1, 4, 6, 6});
  // The transformer policy names matrix products: a CNN block has none.
  auto report = recompose::inspect_policy(recompose::transformer_policy(), block, x);
  CHECK(report.keeps_nothing());
  CHECK(report.to_string().find("keeps nothing") != std::string::npos);
  recompose::inspect_policy(recompose::transformer_policy(), block, x);
  CHECK(count_containing(collector.messages, "keeps nothing") == 1);
}

// Ops in an order no other test runs: the warning is said once per kind of region and process.
struct TanhConvImpl : torch::nn::Module {
  explicit TanhConvImpl(int64_t channels)
      : conv(register_module(
            "conv",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))) {}
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::sigmoid(torch::tanh(conv(x)) * 1.5);
  }
  torch::nn::Conv2d conv;
};
TORCH_MODULE(TanhConv);

TEST_CASE("training with a policy that keeps nothing warns once, for twin blocks too") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  recompose::detail::reset_policy_warnings();  // earlier tests may have used the process's few
  TanhConv a(3), b(3);
  recompose::apply_checkpoint(
      a, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
  recompose::apply_checkpoint(
      b, recompose::CheckpointOptions().policy(recompose::transformer_policy()));
  torch::Tensor x = torch::randn({1, 3, 6, 6});
  for (int step = 0; step < 2; ++step) b(a(x)).sum().backward();
  INFO("warnings: " << collector.messages.size());
  CHECK(count_containing(collector.messages, "the policy kept no output") == 1);
  // A policy that keeps something says nothing.
  TanhConv c(5);
  recompose::apply_checkpoint(
      c, recompose::CheckpointOptions().policy(recompose::SelectivePolicy({"aten::convolution"})));
  c(torch::randn({1, 5, 6, 6})).sum().backward();
  CHECK(count_containing(collector.messages, "the policy kept no output") == 1);
}

TEST_CASE("inspect_policy warns when a policy holds more than no checkpointing would") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  // relu keeps its own output for backward; keeping the wide addmm output too holds more than
  // plain training, which keeps the narrow input and the relu output.
  torch::nn::Sequential net(torch::nn::Linear(4, 64), torch::nn::ReLU());
  torch::Tensor x = torch::randn({16, 4});
  auto report =
      recompose::inspect_policy(recompose::SelectivePolicy({"aten::addmm", "aten::relu"}), net, x);
  CHECK(report.holds_more_than_no_checkpointing());
  CHECK(report.bytes_held_with_policy > report.bytes_held_without_checkpointing);
  CHECK(count_containing(collector.messages, "more than no checkpointing") == 1);
  CHECK(report.to_string().find("warning: the policy holds") != std::string::npos);
}

TEST_CASE(
    "training with a policy that holds more than no checkpointing warns once, for twin blocks "
    "too") {
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  recompose::detail::reset_policy_warnings();
  const char* warning = "more than no checkpointing would hold";
  torch::manual_seed(0);
  WideRelu a, b, plain_a, plain_b;
  for (auto [from, to] : {std::pair{a, plain_a}, std::pair{b, plain_b}}) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < from->parameters().size(); ++i)
      to->parameters()[i].copy_(from->parameters()[i]);
  }
  // Keeping the addmm output as well as the ReLU's holds two wide tensors where plain holds one.
  const recompose::SelectivePolicy keeps_more({"aten::addmm", "aten::relu"});
  recompose::apply_checkpoint(a, recompose::CheckpointOptions().policy(keeps_more));
  recompose::apply_checkpoint(b, recompose::CheckpointOptions().policy(keeps_more));
  torch::Tensor x = torch::randn({16, 4});
  for (int step = 0; step < 2; ++step) b(torch::tanh(a(x)).narrow(1, 0, 4)).sum().backward();
  plain_b(torch::tanh(plain_a(x)).narrow(1, 0, 4)).sum().backward();
  plain_b(torch::tanh(plain_a(x)).narrow(1, 0, 4)).sum().backward();
  INFO("warnings: " << collector.messages.size());
  CHECK(count_containing(collector.messages, warning) == 1);
  CHECK(count_containing(collector.messages, "aten::addmm") == 1);  // names the first kept op
  // The warning changes nothing of what training computes.
  CHECK(torch::equal(a->linear->weight.grad(), plain_a->linear->weight.grad()));
  CHECK(torch::equal(b->linear->weight.grad(), plain_b->linear->weight.grad()));
  // Keeping only what plain training keeps says nothing.
  WideRelu c;
  recompose::apply_checkpoint(
      c, recompose::CheckpointOptions().policy(recompose::SelectivePolicy({"aten::relu"})));
  c(x).sum().backward();
  CHECK(count_containing(collector.messages, warning) == 1);
}

TEST_CASE(
    "inspect_policy on a function: the decisions of a callable policy, swapped ops counted apart") {
  torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  torch::Tensor x = torch::randn({4, 8});
  recompose::SelectivePolicy policy([](const recompose::SelectiveCheckpointContext& ctx,
                                       const c10::OperatorHandle& op, const torch::jit::Stack&) {
    if (op.schema().name() != "aten::mm") return recompose::CheckpointPolicy::PREFER_RECOMPUTE;
    return ctx.call_index == 0 ? recompose::CheckpointPolicy::MUST_SAVE
                               : recompose::CheckpointPolicy::MUST_SWAP;
  });
  auto report = recompose::inspect_policy(
      policy, [&] { (void)torch::mm(torch::mm(x, w).tanh(), w); }, {}, "two matmuls");
  CHECK(report.region == "two matmuls");
  CHECK(report.ops_kept == 1);
  CHECK(report.ops_swapped == 1);
  CHECK(report.bytes_swapped == 4 * 8 * 4);
  CHECK_THROWS_AS(recompose::inspect_policy(policy, nullptr, {}, "empty"), std::invalid_argument);
}

TEST_CASE("inspect_policy names the save list's names that no op of the region matched") {
  torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::ReLU());
  torch::Tensor x = torch::randn({4, 8});
  // addmm and relu run here; bmm does not, and max's dim overload does not either.
  const recompose::SelectivePolicy policy(
      {"aten::addmm", "aten::bmm", "aten::relu.default", "aten::max.dim"});
  CHECK(policy.op_names().size() == 4);
  auto report = recompose::inspect_policy(policy, net, x);
  CHECK(report.unmatched_names == std::vector<std::string>{"aten::bmm", "aten::max.dim"});
  CHECK(report.ops_kept == 2);
  const std::string text = report.to_string();
  CHECK(text.find("no op of this region matched (they keep nothing here): aten::bmm "
                  "aten::max.dim") != std::string::npos);
  // A callable policy has no names to check.
  recompose::SelectivePolicy callable(
      [](const recompose::SelectiveCheckpointContext&, const c10::OperatorHandle&,
         const torch::jit::Stack&) { return recompose::CheckpointPolicy::MUST_SAVE; });
  CHECK(callable.op_names().empty());
  CHECK(recompose::inspect_policy(callable, net, x).unmatched_names.empty());
}

TEST_CASE("inspect_policy leaves the modules as it found them, also when the forward throws") {
  torch::manual_seed(0);
  ConvBlock block(4);
  torch::Tensor x = torch::randn({2, 4, 6, 6});
  auto& mean = block->bn1->running_mean;
  const torch::Tensor mean_before = mean.clone();
  const auto version_before = mean._version();
  const torch::Tensor cpu_state = at::detail::getDefaultCPUGenerator().get_state();

  (void)recompose::inspect_policy(recompose::SelectivePolicy({"aten::convolution"}), block, x);
  CHECK(torch::equal(mean, mean_before));
  // Put back only where written: its version counter is the one autograd checks.
  CHECK(mean._version() == version_before);
  CHECK(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), cpu_state));

  // A forward that moves the statistics and the generator, then throws in the second run.
  int runs = 0;
  auto throws_late = [&] {
    (void)block->forward(x);
    (void)torch::rand({4});
    if (++runs == 2) throw std::runtime_error("the user's forward failed");
  };
  CHECK_THROWS_WITH(recompose::inspect_policy(recompose::SelectivePolicy({"aten::convolution"}),
                                              throws_late, {block.ptr()}, "throws"),
                    "the user's forward failed");
  CHECK(runs == 2);
  CHECK(torch::equal(mean, mean_before));
  CHECK(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), cpu_state));
}

TEST_SUITE_END();

#ifndef RECOMPOSE_TEST_NO_PLANNER
// One annotated child, for the planner's profile.
struct WideReluHolderImpl : torch::nn::Module {
  WideReluHolderImpl() : block(register_module("block", WideRelu())) {}
  torch::Tensor forward(torch::Tensor x) { return block(x); }
  WideRelu block;
};
TORCH_MODULE(WideReluHolder);

TEST_CASE("the planner's profiling neither gives nor uses up the policy warnings") {
  recompose::detail::reset_policy_warnings();
  WarningCollector collector;
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  WideReluHolder net;
  const torch::Tensor x = torch::randn({8, 4});
  // The profile runs the block under a keep-all policy, which keeps more than autograd saves.
  recompose::profile_memory(*net, [&] { net(x).sum().backward(); });
  CHECK(count_containing(collector.messages, "more than no checkpointing") == 0);
  // The same finding about the user's own policy is still given.
  recompose::apply_checkpoint(net->block,
                              recompose::CheckpointOptions().policy(
                                  recompose::SelectivePolicy({"aten::addmm", "aten::relu"})));
  net(x).sum().backward();
  CHECK(count_containing(collector.messages, "more than no checkpointing") == 1);
}
#endif

TEST_CASE("inspect_policy takes a module reference as well as a holder") {
  WideRelu block;
  const torch::Tensor x = torch::randn({8, 4});
  const auto by_holder =
      recompose::inspect_policy(recompose::SelectivePolicy({"aten::addmm"}), block, x);
  const auto by_reference =
      recompose::inspect_policy(recompose::SelectivePolicy({"aten::addmm"}), *block, x);
  CHECK(by_reference.ops_kept == 1);
  CHECK(by_reference.ops_kept == by_holder.ops_kept);
  CHECK(by_reference.bytes_held_with_policy == by_holder.bytes_held_with_policy);
}
