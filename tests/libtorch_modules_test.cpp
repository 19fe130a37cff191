// LibTorch's own modules (torch::nn::Sequential, Linear, TransformerEncoderLayer, ...): their
// forward cannot carry RECOMPOSE_FORWARD, so the composable APIs refuse them with a message that
// names what works instead, and that alternative works. The code of
// docs/guide/modules-you-cannot-annotate.md, as run here.
#include "support/grad_check.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <string>

namespace {

std::string refusal_of(const std::function<void()>& apply) {
  try {
    apply();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("expected std::invalid_argument");
  return {};
}

}  // namespace

TEST_SUITE_BEGIN("libtorch modules");

TEST_CASE(
    "apply_checkpoint on a torch::nn::Sequential names checkpoint_sequential, not LibTorch's "
    "source") {
  torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::ReLU());
  const std::string msg = refusal_of([&] { recompose::apply_checkpoint(seq); });
  CHECK(msg.find("recompose::apply_checkpoint") != std::string::npos);
  CHECK(msg.find("torch::nn::SequentialImpl") != std::string::npos);
  CHECK(msg.find("checkpoint_sequential") != std::string::npos);
  CHECK(msg.find("SequentialImpl::forward") == std::string::npos);  // no file the user can edit
  CHECK_FALSE(recompose::is_checkpointed(*seq));
}

TEST_CASE(
    "apply_checkpoint on other LibTorch modules names checkpoint(fn, ...) with state_modules") {
  torch::nn::TransformerEncoderLayer layer(torch::nn::TransformerEncoderLayerOptions(8, 2));
  torch::nn::Linear linear(4, 4);
  for (const std::string& msg : {refusal_of([&] { recompose::apply_checkpoint(layer); }),
                                 refusal_of([&] { recompose::apply_checkpoint(linear); })}) {
    CHECK(msg.find("one of LibTorch's own modules") != std::string::npos);
    CHECK(msg.find("recompose::checkpoint(") != std::string::npos);
    CHECK(msg.find("state_modules") != std::string::npos);
    CHECK(msg.find("checkpoint_sequential") == std::string::npos);
    CHECK(msg.find("Impl::forward") == std::string::npos);
  }
}

#ifndef RECOMPOSE_TEST_NO_SWAP
TEST_CASE("apply_offload on a LibTorch module names the scopes that offload around its call") {
  torch::nn::Linear linear(4, 4);
  const std::string msg = refusal_of([&] { recompose::apply_offload(linear); });
  CHECK(msg.find("recompose::apply_offload") != std::string::npos);
  CHECK(msg.find("AsyncSaveOnCpu") != std::string::npos);
  CHECK(msg.find("LinearImpl::forward") == std::string::npos);
  CHECK_FALSE(recompose::is_offloaded(*linear));
}
#endif

TEST_CASE("modules you cannot annotate: a model's own modules still get the annotation hint") {
  struct MineImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x) { return x; }
  };
  auto mine = std::make_shared<MineImpl>();
  const std::string msg = refusal_of([&] { recompose::apply_checkpoint(mine); });
  CHECK(msg.find("Add RECOMPOSE_FORWARD") != std::string::npos);
  CHECK(msg.find("MineImpl::forward") != std::string::npos);
}

// --- docs/guide/modules-you-cannot-annotate.md ---------------------------------------------

TEST_CASE("guide: a torch::nn::Sequential through checkpoint_sequential, bitwise as without") {
  torch::manual_seed(0);
  torch::nn::Sequential seq(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Dropout(0.1),
                            torch::nn::Linear(32, 32), torch::nn::ReLU(),
                            torch::nn::Linear(32, 16));
  torch::Tensor x = torch::randn({8, 16});

  torch::manual_seed(1);
  auto plain = rt::grads_of([&] { return seq->forward(x).pow(2).sum(); }, seq->parameters());
  torch::manual_seed(1);
  auto checkpointed = rt::grads_of(
      [&] {
        // [guide:sequential]
        torch::Tensor y = recompose::checkpoint_sequential(seq, /*segments=*/3, x);
        // [/guide:sequential]
        return y.pow(2).sum();
      },
      seq->parameters());
  CHECK(rt::bitwise_equal(plain, checkpointed));
}

TEST_CASE(
    "guide: a TransformerEncoderLayer through checkpoint(fn, ...) with state_modules, bitwise as "
    "without") {
  torch::manual_seed(0);
  torch::nn::TransformerEncoderLayer layer(
      torch::nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).dropout(0.1));
  torch::Tensor x = torch::randn({10, 2, 32});  // (sequence, batch, features)

  torch::manual_seed(1);
  auto plain = rt::grads_of([&] { return layer->forward(x).pow(2).sum(); }, layer->parameters());
  torch::manual_seed(1);
  auto checkpointed = rt::grads_of(
      [&] {
        // [guide:layer]
        torch::Tensor y = recompose::checkpoint(
            recompose::CheckpointOptions().state_modules({layer.ptr()}),
            [&](const torch::Tensor& src) { return layer->forward(src); }, x);
        // [/guide:layer]
        return y.pow(2).sum();
      },
      layer->parameters());
  CHECK(rt::bitwise_equal(plain, checkpointed));
}

TEST_CASE("guide: state_modules keeps BatchNorm's running statistics as without checkpointing") {
  torch::manual_seed(0);
  torch::nn::Sequential plain_net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
                                  torch::nn::BatchNorm2d(8), torch::nn::ReLU());
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
                            torch::nn::BatchNorm2d(8), torch::nn::ReLU());
  torch::Tensor x = torch::randn({4, 3, 8, 8});
  plain_net->forward(x).sum().backward();
  // [guide:batchnorm]
  torch::Tensor y = recompose::checkpoint(
      recompose::CheckpointOptions().state_modules({net.ptr()}),
      [&](const torch::Tensor& in) { return net->forward(in); }, x);
  y.sum().backward();  // the recomputation does not update the running statistics a second time
  // [/guide:batchnorm]
  auto bn_plain = plain_net[1]->as<torch::nn::BatchNorm2d>();
  auto bn = net[1]->as<torch::nn::BatchNorm2d>();
  CHECK(torch::equal(bn->running_mean, bn_plain->running_mean));
  CHECK(torch::equal(bn->running_var, bn_plain->running_var));
  CHECK(bn->num_batches_tracked.item<int64_t>() == 1);
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    CHECK(torch::equal(net->parameters()[i].grad(), plain_net->parameters()[i].grad()));
  }
}

TEST_SUITE_END();
