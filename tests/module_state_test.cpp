// Module state across the recomputation: buffers updated exactly once, the forward's train/eval
// mode, autocast's cast cache, and the process-wide switches' guards.
#include "engine/region_switches.h"
#include "support/grad_check.h"

#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <functional>
#include <string>
#include <vector>

using recompose::CheckpointOptions;

namespace {

// Conv2d + BatchNorm2d + ReLU with a residual add: the block that showed buffers updated twice.
struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(int64_t channels) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(channels));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::relu(bn(conv(x))) + x;
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBlock);

struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(int64_t blocks, int64_t channels = 3) {
    for (int64_t i = 0; i < blocks; ++i) {
      this->blocks.push_back(register_module("block" + std::to_string(i), ConvBlock(channels)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    for (auto& b : blocks) x = b(x);
    return x;
  }
  std::vector<ConvBlock> blocks;
};
TORCH_MODULE(ConvNet);

ConvNet make_net(int64_t blocks) {
  torch::manual_seed(7);
  return ConvNet(blocks);
}

// A user buffer that the forward advances and reads: the recomputation must see the value the
// forward saw, and the counter must advance once per step.
struct CountingBlockImpl : torch::nn::Module {
  CountingBlockImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    count = register_buffer("count", torch::zeros({1}));
    ema = register_buffer("ema", torch::zeros({4}));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    {
      torch::NoGradGuard no_grad;
      count.add_(1);
      ema.mul_(0.9).add_(x.mean(0), 0.1);
    }
    return torch::tanh(fc(x)) * count;
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor count, ema;
};
TORCH_MODULE(CountingBlock);

// Reads its mode: the recomputation must run in the mode the forward ran in.
struct ModeBlockImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::sin(x * (is_training() ? 2.0 : 1.0));
  }
};
TORCH_MODULE(ModeBlock);

std::vector<torch::Tensor> state_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.clone());
  return out;
}

std::vector<torch::Tensor> grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

// Trains `net` for `steps` SGD steps on fixed data; returns the losses.
std::vector<torch::Tensor> train(torch::nn::Module& net, const std::function<torch::Tensor(torch::Tensor)>& forward,
                                 int steps) {
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.1));
  std::vector<torch::Tensor> losses;
  torch::manual_seed(100);
  for (int s = 0; s < steps; ++s) {
    torch::Tensor x = torch::randn({4, 3, 6, 6});
    opt.zero_grad();
    torch::Tensor loss = forward(x).pow(2).mean();
    loss.backward();
    opt.step();
    losses.push_back(loss.detach());
  }
  return losses;
}

}  // namespace

TEST_SUITE("module state") {

TEST_CASE("BatchNorm statistics are updated once per step, for every checkpoint form") {
  const int steps = 4;
  ConvNet plain = make_net(2);
  auto ref_losses = train(*plain, [&](torch::Tensor x) { return plain(x); }, steps);
  auto ref_state = state_of(*plain);
  CHECK(plain->blocks[0]->bn->num_batches_tracked.item<int64_t>() == steps);

  auto check_same = [&](ConvNet& net, const std::vector<torch::Tensor>& losses) {
    CHECK(rt::bitwise_equal(losses, ref_losses));
    CHECK(net->blocks[0]->bn->num_batches_tracked.item<int64_t>() == steps);
    CHECK(rt::bitwise_equal(state_of(*net), ref_state));
    // Eval-mode outputs (which read the running statistics) equal the plain model's.
    net->eval();
    plain->eval();
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::randn({2, 3, 6, 6});
    CHECK(torch::equal(net(x), plain(x)));
    plain->train();
  };

  SUBCASE("apply_checkpoint") {
    ConvNet net = make_net(2);
    for (auto& b : net->blocks) recompose::apply_checkpoint(b);
    check_same(net, train(*net, [&](torch::Tensor x) { return net(x); }, steps));
  }
  SUBCASE("apply_checkpoint without early stop") {
    ConvNet net = make_net(2);
    for (auto& b : net->blocks) recompose::apply_checkpoint(b, CheckpointOptions().early_stop(false));
    check_same(net, train(*net, [&](torch::Tensor x) { return net(x); }, steps));
  }
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  SUBCASE("apply_checkpoint with a selective policy") {
    ConvNet net = make_net(2);
    for (auto& b : net->blocks) {
      recompose::apply_checkpoint(b, CheckpointOptions().policy(recompose::SelectivePolicy({"aten::convolution"})));
    }
    check_same(net, train(*net, [&](torch::Tensor x) { return net(x); }, steps));
  }
#endif
  SUBCASE("apply_checkpoint on the whole net (nested modules)") {
    ConvNet net = make_net(2);
    recompose::apply_checkpoint(net);
    recompose::apply_checkpoint(net->blocks[1]);
    check_same(net, train(*net, [&](torch::Tensor x) { return net(x); }, steps));
  }
  SUBCASE("functional checkpoint naming its modules in state_modules") {
    ConvNet net = make_net(2);
    auto options = CheckpointOptions().state_modules({net->blocks[0].ptr(), net->blocks[1].ptr()});
    check_same(net, train(*net, [&](torch::Tensor x) {
      return recompose::checkpoint(options, [&](const torch::Tensor& in) { return net(in); }, x);
    }, steps));
  }
  SUBCASE("checkpoint_sequential knows its modules") {
    ConvNet net = make_net(2);
    torch::nn::Sequential seq(net->blocks[0], net->blocks[1]);
    check_same(net, train(*net, [&](torch::Tensor x) { return recompose::checkpoint_sequential(seq, 2, x); }, steps));
  }
}

TEST_CASE("preserve_module_state(false) and a functional body without state_modules update buffers twice") {
  // The documented cost of opting out: shows that the preservation is what makes the
  // difference (and that the tests above would fail without it).
  ConvNet net = make_net(1);
  recompose::apply_checkpoint(net->blocks[0], CheckpointOptions().preserve_module_state(false));
  train(*net, [&](torch::Tensor x) { return net(x); }, 1);
  CHECK(net->blocks[0]->bn->num_batches_tracked.item<int64_t>() == 2);

  ConvNet functional = make_net(1);
  train(*functional, [&](torch::Tensor x) {
    return recompose::checkpoint([&](const torch::Tensor& in) { return functional(in); }, x);
  }, 1);
  CHECK(functional->blocks[0]->bn->num_batches_tracked.item<int64_t>() == 2);
}

TEST_CASE("a buffer the forward reads after writing it: the recomputation sees the forward's value") {
  torch::manual_seed(3);
  CountingBlock plain;
  torch::manual_seed(3);
  CountingBlock ckpt;
  recompose::apply_checkpoint(ckpt);
  torch::Tensor x = torch::randn({5, 4});
  for (int step = 0; step < 3; ++step) {
    for (auto* m : {&plain, &ckpt}) {
      (*m)->zero_grad();
      (*m)(x).sum().backward();
    }
    CHECK(rt::bitwise_equal(grads(*plain), grads(*ckpt)));
    CHECK(ckpt->count.item<float>() == static_cast<float>(step + 1));
    CHECK(torch::equal(ckpt->ema, plain->ema));
  }
  SUBCASE("and again with retain_graph and a second backward") {
    for (auto* m : {&plain, &ckpt}) {
      (*m)->zero_grad();
      torch::Tensor loss = (*m)(x).sum();
      loss.backward({}, /*retain_graph=*/true);
      loss.backward();
    }
    CHECK(rt::bitwise_equal(grads(*plain), grads(*ckpt)));
    CHECK(torch::equal(ckpt->count, plain->count));
    CHECK(torch::equal(ckpt->ema, plain->ema));
  }
}

TEST_CASE("train/eval switched between forward and backward: the recomputation runs in the forward's mode") {
  ModeBlock plain, ckpt;
  recompose::apply_checkpoint(ckpt);
  torch::Tensor x = torch::randn({6}, torch::requires_grad());
  auto grad_with_switch = [&](ModeBlock& m) {
    m->train();
    torch::Tensor y = m(x).sum();
    m->eval();
    return torch::autograd::grad({y}, {x})[0];
  };
  CHECK(torch::equal(grad_with_switch(plain), grad_with_switch(ckpt)));
  CHECK_FALSE(ckpt->is_training());  // the switch made by the user stays

  SUBCASE("BatchNorm: eval() before backward") {
    ConvNet net_plain = make_net(1), net_ckpt = make_net(1);
    recompose::apply_checkpoint(net_ckpt->blocks[0]);
    torch::Tensor in = torch::randn({4, 3, 6, 6});
    std::vector<std::vector<torch::Tensor>> g;
    for (auto* net : {&net_plain, &net_ckpt}) {
      (*net)->train();
      torch::Tensor loss = (*net)(in).pow(2).sum();
      (*net)->eval();
      loss.backward();
      g.push_back(grads(**net));
    }
    CHECK(rt::bitwise_equal(g[0], g[1]));
    CHECK(rt::bitwise_equal(state_of(*net_plain), state_of(*net_ckpt)));
  }
}

TEST_CASE("autocast: the recomputation leaves no cast in the cache for the next step") {
  // A 4-step SGD loop under CPU bf16 autocast, used as torch.autocast does (nesting + cache
  // cleared when the outermost scope ends), with checkpointed blocks.
  auto run = [](bool checkpointed) {
    torch::manual_seed(11);
    torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.5));
    std::vector<torch::Tensor> losses;
    torch::Tensor x = torch::randn({4, 8});
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      at::autocast::increment_nesting();
      torch::Tensor loss;
      try {
        auto body = [&](const torch::Tensor& in) { return torch::tanh(net->forward(in)); };
        torch::Tensor y = checkpointed ? recompose::checkpoint(body, x) : body(x);
        loss = y.to(torch::kFloat).pow(2).mean();
      } catch (...) {
        at::autocast::set_autocast_enabled(at::kCPU, false);
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        throw;
      }
      at::autocast::set_autocast_enabled(at::kCPU, false);
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      loss.backward();
      opt.step();
      losses.push_back(loss.detach());
    }
    return losses;
  };
  CHECK(rt::bitwise_equal(run(false), run(true)));
}

TEST_CASE("the generators end a step where they end without checkpointing") {
  auto run = [](bool checkpointed) {
    torch::manual_seed(5);
    torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::Dropout(0.5), torch::nn::Linear(8, 8));
    torch::Tensor x = torch::randn({4, 8});
    auto body = [&](const torch::Tensor& in) { return net->forward(in); };
    torch::Tensor loss = (checkpointed ? recompose::checkpoint(body, x) : body(x)).sum();
    loss.backward();
    return at::detail::getDefaultCPUGenerator().get_state();
  };
  CHECK(torch::equal(run(false), run(true)));
}

TEST_CASE("switch guards may end in any order") {
  auto debug_now = [] { return recompose::detail::debug_override(); };
  SUBCASE("debug") {
    {
      auto* first = new recompose::SwitchGuard(recompose::set_checkpoint_debug_enabled(true));
      auto second = recompose::set_checkpoint_debug_enabled(false);
      CHECK(debug_now() == std::optional<bool>(false));
      delete first;  // ended before the guard made after it
      CHECK(debug_now() == std::optional<bool>(false));
    }
    CHECK_FALSE(debug_now().has_value());  // not left forced on
  }
  SUBCASE("early stop") {
    auto* first = new recompose::SwitchGuard(recompose::set_checkpoint_early_stop(false));
    {
      auto second = recompose::set_checkpoint_early_stop(true);
      delete first;
      CHECK(recompose::detail::early_stop_override() == std::optional<bool>(true));
    }
    CHECK_FALSE(recompose::detail::early_stop_override().has_value());
  }
}

}  // TEST_SUITE
