// Module state across the recomputation: buffers updated exactly once, the forward's train/eval
// mode, autocast's cast cache, and the process-wide switches' guards.
#include "engine/module_state_locks.h"
#include "engine/region_switches.h"
#include "support/grad_check.h"

#include <recompose/recompose.h>
#include <recompose/selective_checkpoint.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using recompose::CheckpointOptions;

namespace {

// Conv2d + BatchNorm2d + ReLU with a residual add: the block that showed buffers updated twice.
struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(int64_t channels) {
    conv = register_module(
        "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)));
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
  for (const auto& p : m.parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

// Trains `net` for `steps` SGD steps on fixed data; returns the losses.
std::vector<torch::Tensor> train(torch::nn::Module& net,
                                 const std::function<torch::Tensor(torch::Tensor)>& forward,
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

// A block around a BatchNorm it may share with other modules (registered as its child, so that
// the BatchNorm's state belongs to this block's region). `calls`: how often the block applies it.
struct BnBlockImpl : torch::nn::Module {
  BnBlockImpl(torch::nn::BatchNorm1d shared, int calls) : calls(calls) {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    bn = register_module("bn", std::move(shared));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    x = fc(torch::relu(x));
    for (int i = 0; i < calls; ++i) x = bn(x);
    return torch::tanh(x);
  }
  int calls;
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnBlock);

// One BatchNorm shared by two blocks and by code outside them.
struct SharedBnNetImpl : torch::nn::Module {
  explicit SharedBnNetImpl(int calls_per_block) {
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    first = register_module("first", BnBlock(bn, calls_per_block));
    second = register_module("second", BnBlock(bn, calls_per_block));
  }
  // `forward` of the test case: the layouts below call the pieces in various orders.
  torch::nn::BatchNorm1d bn{nullptr};
  BnBlock first{nullptr}, second{nullptr};
};
TORCH_MODULE(SharedBnNet);

// A module whose forward calls the shared BatchNorm outside the block (for apply_offload).
struct OutsideThenBlockImpl : torch::nn::Module {
  explicit OutsideThenBlockImpl(SharedBnNet net) : net(std::move(net)) {
    register_module("net", this->net);
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return net->first(net->bn(x));
  }
  SharedBnNet net;
};
TORCH_MODULE(OutsideThenBlock);

// Everything a training step leaves behind, in a fixed order, plus the version counters of the
// buffers (which autograd checks for the tensors it saved).
struct StepRecord {
  std::vector<torch::Tensor> values;
  std::vector<int64_t> buffer_versions;
};

// Parameters without repeats (a shared module is reached through several parents).
std::vector<torch::Tensor> unique_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    if (std::none_of(out.begin(), out.end(), [&](const torch::Tensor& q) { return q.is_same(p); }))
      out.push_back(p);
  }
  return out;
}

// Trains a fresh SharedBnNet for `steps` SGD steps; `setup` may apply recompose to it, `loss`
// runs the forward (and whatever it needs before backward).
StepRecord train_shared(
    int calls_per_block, const std::function<void(SharedBnNet&)>& setup,
    const std::function<torch::Tensor(SharedBnNet&, const torch::Tensor&)>& loss_of,
    int steps = 3) {
  torch::manual_seed(21);
  SharedBnNet net(calls_per_block);
  setup(net);
  auto params = unique_parameters(*net);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  StepRecord rec;
  torch::manual_seed(22);
  for (int s = 0; s < steps; ++s) {
    torch::Tensor x = torch::randn({6, 4});
    opt.zero_grad();
    torch::Tensor loss = loss_of(net, x);
    loss.backward();
    rec.values.push_back(loss.detach());
    for (const auto& p : params)
      rec.values.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    opt.step();
    for (const auto& b : net->bn->buffers()) {
      rec.values.push_back(b.clone());
      rec.buffer_versions.push_back(b._version());
    }
  }
  for (const auto& p : params) rec.values.push_back(p.detach().clone());
  return rec;
}

// Threads meet here: each waits until all have arrived, or gives up after `patience`.
class Rendezvous {
 public:
  explicit Rendezvous(int parties) : parties_(parties) {}
  // True when every party arrived within `patience` of this one.
  bool meet(std::chrono::seconds patience) {
    std::unique_lock lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return true;
    }
    if (all_arrived_.wait_for(lock, patience, [&] { return generation_ != generation; }))
      return true;
    --arrived_;  // gave up: later meetings count without it
    return false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int parties_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// A BatchNorm block whose recomputation waits for the other threads' recomputations: they meet
// only if recomputations over different modules run at once.
struct MeetingBlockImpl : torch::nn::Module {
  explicit MeetingBlockImpl(Rendezvous* rendezvous) : rendezvous(rendezvous) {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    if (rendezvous != nullptr && recompose::is_recomputing()) {
      if (!rendezvous->meet(std::chrono::seconds(5))) missed_meetings.fetch_add(1);
    }
    return torch::tanh(bn(fc(x)));
  }
  Rendezvous* rendezvous;
  std::atomic<int> missed_meetings{0};
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(MeetingBlock);
}  // namespace

TEST_SUITE("module state") {
  TEST_CASE("BatchNorm statistics are updated once per step, for every checkpoint form") {
    const int steps = 4;
    ConvNet plain = make_net(2);
    auto ref_losses = train(
        *plain, [&](torch::Tensor x) { return plain(x); }, steps);
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
      check_same(net, train(
                          *net, [&](torch::Tensor x) { return net(x); }, steps));
    }
    SUBCASE("apply_checkpoint without early stop") {
      ConvNet net = make_net(2);
      for (auto& b : net->blocks)
        recompose::apply_checkpoint(b, CheckpointOptions().early_stop(false));
      check_same(net, train(
                          *net, [&](torch::Tensor x) { return net(x); }, steps));
    }
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
    SUBCASE("apply_checkpoint with a selective policy") {
      ConvNet net = make_net(2);
      for (auto& b : net->blocks) {
        recompose::apply_checkpoint(
            b, CheckpointOptions().policy(recompose::SelectivePolicy({"aten::convolution"})));
      }
      check_same(net, train(
                          *net, [&](torch::Tensor x) { return net(x); }, steps));
    }
#endif
    SUBCASE("apply_checkpoint on the whole net (nested modules)") {
      ConvNet net = make_net(2);
      recompose::apply_checkpoint(net);
      recompose::apply_checkpoint(net->blocks[1]);
      check_same(net, train(
                          *net, [&](torch::Tensor x) { return net(x); }, steps));
    }
    SUBCASE("functional checkpoint naming its modules in state_modules") {
      ConvNet net = make_net(2);
      auto options =
          CheckpointOptions().state_modules({net->blocks[0].ptr(), net->blocks[1].ptr()});
      check_same(net, train(
                          *net,
                          [&](torch::Tensor x) {
                            return recompose::checkpoint(
                                options, [&](const torch::Tensor& in) { return net(in); }, x);
                          },
                          steps));
    }
    SUBCASE("checkpoint_sequential knows its modules") {
      ConvNet net = make_net(2);
      torch::nn::Sequential seq(net->blocks[0], net->blocks[1]);
      check_same(
          net,
          train(
              *net, [&](torch::Tensor x) { return recompose::checkpoint_sequential(seq, 2, x); },
              steps));
    }
  }

  TEST_CASE(
      "a BatchNorm whose forward leaves its running mean as it was, called again before backward") {
    // Issue 23, item 1. The first call sees an all-zero batch (ReLU of negative inputs): its batch
    // mean equals the running mean (0), so its forward writes running_mean without changing it.
    // The second call moves it. The first call's recomputation must start from the value the
    // first forward saw (0), not from the second call's result.
    auto run = [](bool checkpointed) {
      torch::manual_seed(4);
      BnBlock block(torch::nn::BatchNorm1d(4), 1);
      if (checkpointed) recompose::apply_checkpoint(block);
      torch::Tensor zeros_after_relu = -torch::rand({6, 4}) - 1.0;
      torch::Tensor x = torch::randn({6, 4});
      // fc(relu(x)) of the first call is fc's bias on every row: zero it so that the batch is zero.
      {
        torch::NoGradGuard no_grad;
        block->fc->bias.zero_();
      }
      torch::Tensor first =
          block(zeros_after_relu);  // in this order (operands of + are unsequenced)
      torch::Tensor second = block(x);
      torch::Tensor loss = first.sum() + second.pow(2).sum();
      loss.backward();
      std::vector<torch::Tensor> out = {loss.detach()};
      for (const auto& b : block->buffers()) out.push_back(b.clone());
      for (const auto& p : block->parameters()) out.push_back(p.grad().clone());
      return out;
    };
    const auto plain = run(false);
    const auto ckpt = run(true);
    REQUIRE(plain.size() == ckpt.size());
    CHECK(
        torch::equal(plain[1], ckpt[1]));  // running_mean: 0.9x its value without recompose before
    CHECK(rt::bitwise_equal(plain, ckpt));
  }

  TEST_CASE("a BatchNorm shared by regions and by code outside them trains as without recompose") {
    // Issue 23, item 2: the recomputation puts the entry values in place without moving the
    // version counters that autograd checks for the tensors saved outside the region.
    auto none = [](SharedBnNet&) {};
    auto both_blocks = [](SharedBnNet& net) {
      recompose::apply_checkpoint(net->first);
      recompose::apply_checkpoint(net->second);
    };
    // `loss_of(net, x, with_recompose)`; the reference run has no recompose at all.
    using LossFn = std::function<torch::Tensor(SharedBnNet&, const torch::Tensor&, bool)>;
    auto check = [&](int calls, const std::function<void(SharedBnNet&)>& setup,
                     const LossFn& loss_of) {
      const StepRecord plain = train_shared(
          calls, none,
          [&](SharedBnNet& n, const torch::Tensor& x) { return loss_of(n, x, false); });
      StepRecord ckpt;
      CHECK_NOTHROW(ckpt = train_shared(calls, setup, [&](SharedBnNet& n, const torch::Tensor& x) {
                      return loss_of(n, x, true);
                    }));
      CHECK(rt::bitwise_equal(plain.values, ckpt.values));
      CHECK(plain.buffer_versions == ckpt.buffer_versions);
    };
    SUBCASE("called twice in one region") {
      check(2, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->first(x).pow(2).sum();
      });
    }
    SUBCASE("one region called twice") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->first(net->first(x)).pow(2).sum();
      });
    }
    SUBCASE("shared between two regions") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->second(net->first(x)).pow(2).sum();
      });
    }
    SUBCASE("called outside, then in a region") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->first(net->bn(x)).pow(2).sum();
      });
    }
    SUBCASE("called in a region, then outside") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->bn(net->first(x)).pow(2).sum();
      });
    }
    SUBCASE("outside, in a region, outside again, in the other region") {
      check(2, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        return net->second(net->bn(net->first(net->bn(x)))).pow(2).sum();
      });
    }
    SUBCASE("functional checkpoint naming the BatchNorm in state_modules") {
      check(1, none, [](SharedBnNet& net, const torch::Tensor& x, bool with_recompose) {
        auto options = CheckpointOptions().state_modules({net->bn.ptr()});
        auto body = [&](const torch::Tensor& in) { return torch::tanh(net->bn(in)); };
        torch::Tensor y = net->bn(x);
        y = with_recompose ? recompose::checkpoint(options, body, y) : body(y);
        return net->bn(y).pow(2).sum();
      });
    }
#ifndef RECOMPOSE_TEST_NO_SWAP
    SUBCASE("under AsyncSaveOnCpu") {
      auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
      check(1, both_blocks, [&](SharedBnNet& net, const torch::Tensor& x, bool with_recompose) {
        std::optional<recompose::AsyncSaveOnCpu> offload;
        if (with_recompose) offload.emplace(manager);
        return net->second(net->bn(net->first(net->bn(x)))).pow(2).sum();
      });
      CHECK(manager->stats().tensors_offloaded > 0);
    }
    SUBCASE("under apply_offload") {
      auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
      std::shared_ptr<OutsideThenBlockImpl> outer;
      auto setup = [&](SharedBnNet& net) {
        recompose::apply_checkpoint(net->first);
        outer = std::make_shared<OutsideThenBlockImpl>(net);
        recompose::apply_offload(
            outer, recompose::OffloadOptions().manager(manager).keep_last_on_device(false));
      };
      auto plain_setup = [&](SharedBnNet& net) {
        outer = std::make_shared<OutsideThenBlockImpl>(net);
      };
      auto loss_of = [&](SharedBnNet&, const torch::Tensor& x) {
        return outer->forward(x).pow(2).sum();
      };
      const StepRecord plain = train_shared(1, plain_setup, loss_of);
      StepRecord ckpt;
      CHECK_NOTHROW(ckpt = train_shared(1, setup, loss_of));
      CHECK(rt::bitwise_equal(plain.values, ckpt.values));
      CHECK(plain.buffer_versions == ckpt.buffer_versions);
      CHECK(recompose::offload_stats(*outer).tensors_offloaded > 0);
    }
#endif
    SUBCASE("under a SavedTensorMeter") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool with_recompose) {
        std::optional<recompose::SavedTensorMeter> meter;
        if (with_recompose) meter.emplace();
        return net->second(net->bn(net->first(net->bn(x)))).pow(2).sum();
      });
    }
    SUBCASE("a region called twice, then grad(create_graph) and a second backward") {
      check(1, both_blocks, [](SharedBnNet& net, const torch::Tensor& x, bool) {
        torch::Tensor in = x.clone().requires_grad_(true);
        torch::Tensor y = net->first(net->first(in)).pow(2).sum();
        torch::Tensor g =
            torch::autograd::grad({y}, {in}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
        return g.pow(2).sum() + y;
      });
    }
  }

  TEST_CASE(
      "preserve_module_state(false) and a functional body without state_modules update buffers "
      "twice") {
    // The documented cost of opting out: shows that the preservation is what makes the
    // difference (and that the tests above would fail without it).
    ConvNet net = make_net(1);
    recompose::apply_checkpoint(net->blocks[0], CheckpointOptions().preserve_module_state(false));
    train(
        *net, [&](torch::Tensor x) { return net(x); }, 1);
    CHECK(net->blocks[0]->bn->num_batches_tracked.item<int64_t>() == 2);

    ConvNet functional = make_net(1);
    train(
        *functional,
        [&](torch::Tensor x) {
          return recompose::checkpoint([&](const torch::Tensor& in) { return functional(in); }, x);
        },
        1);
    CHECK(functional->blocks[0]->bn->num_batches_tracked.item<int64_t>() == 2);
  }

  TEST_CASE(
      "a buffer the forward reads after writing it: the recomputation sees the forward's value") {
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

  TEST_CASE(
      "a buffer the region writes in place, saved by code outside it and used after the "
      "recomputation") {
    // The recomputation writes the buffer again (count.add_): into a copy with a version counter of
    // its own, so that the tensor saved outside the region (after it) still passes autograd's
    // check.
    auto run = [](bool checkpointed) {
      torch::manual_seed(3);
      CountingBlock block;
      if (checkpointed) recompose::apply_checkpoint(block);
      torch::Tensor x = torch::randn({5, 4});
      torch::Tensor other = torch::randn({4}, torch::requires_grad());
      torch::Tensor region_loss = block(x).sum();
      torch::Tensor outside_loss = (other * block->ema).sum();  // saves ema at its current version
      region_loss.backward();                                   // recomputes the region
      outside_loss.backward();
      std::vector<torch::Tensor> out = grads(*block);
      out.push_back(other.grad().clone());
      out.push_back(block->count.clone());
      out.push_back(block->ema.clone());
      return std::make_pair(out, block->ema._version());
    };
    const auto plain = run(false);
    std::pair<std::vector<torch::Tensor>, int64_t> ckpt;
    REQUIRE_NOTHROW(ckpt = run(true));
    CHECK(rt::bitwise_equal(plain.first, ckpt.first));
    CHECK(plain.second == ckpt.second);
  }

  TEST_CASE(
      "train/eval switched between forward and backward: the recomputation runs in the forward's "
      "mode") {
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
      torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::Dropout(0.5),
                                torch::nn::Linear(8, 8));
      torch::Tensor x = torch::randn({4, 8});
      auto body = [&](const torch::Tensor& in) { return net->forward(in); };
      torch::Tensor loss = (checkpointed ? recompose::checkpoint(body, x) : body(x)).sum();
      loss.backward();
      return at::detail::getDefaultCPUGenerator().get_state();
    };
    CHECK(torch::equal(run(false), run(true)));
  }

  TEST_CASE("four threads over their own modules recompute at once, as without recompose") {
    // One model per thread: their buffers are distinct, so their recomputations take no lock in
    // common (See Note [ Module state locks ]) and must all be inside the forward together.
    constexpr int kThreads = 4;
    constexpr int kSteps = 3;
    auto make_model = [](Rendezvous* rendezvous) {
      torch::manual_seed(31);
      return MeetingBlock(rendezvous);
    };
    torch::manual_seed(32);
    std::vector<torch::Tensor> inputs;
    for (int s = 0; s < kSteps; ++s) inputs.push_back(torch::randn({6, 4}));
    // Trains for kSteps; returns the losses, gradients and buffers of every step.
    auto train_block = [&](MeetingBlock& block) {
      torch::optim::SGD opt(block->parameters(), torch::optim::SGDOptions(0.1));
      std::vector<torch::Tensor> record;
      for (const auto& x : inputs) {
        opt.zero_grad();
        torch::Tensor loss = block(x).pow(2).sum();
        loss.backward();
        record.push_back(loss.detach());
        for (const auto& p : block->parameters()) record.push_back(p.grad().clone());
        opt.step();
        for (const auto& b : block->buffers()) record.push_back(b.clone());
      }
      return record;
    };
    MeetingBlock plain = make_model(nullptr);
    const std::vector<torch::Tensor> expected = train_block(plain);

    Rendezvous rendezvous(kThreads);
    std::vector<MeetingBlock> blocks;
    for (int t = 0; t < kThreads; ++t) {
      blocks.push_back(make_model(&rendezvous));
      recompose::apply_checkpoint(blocks.back());
    }
    std::vector<std::vector<torch::Tensor>> records(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] { records[t] = train_block(blocks[t]); });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
      CAPTURE(t);
      CHECK(blocks[t]->missed_meetings.load() == 0);  // every recomputation met the others
      CHECK(rt::bitwise_equal(records[t], expected));
    }
  }

  TEST_CASE("module state locks: nested scopes count, an out-of-order wait ends in an error") {
    using recompose::detail::ModuleStateLocks;
    int low_object = 0, high_object = 0;  // two keys, ordered by address
    const void* low = &low_object;
    const void* high = &high_object;
    if (std::less<const void*>()(high, low)) std::swap(low, high);
    SUBCASE("a thread's nested scope over keys it holds does not wait") {
      ModuleStateLocks outer({low, high});
      ModuleStateLocks inner({high, low, high});
      CHECK_FALSE(inner.empty());
    }
    SUBCASE("opposite nesting on two threads: the out-of-order side fails instead of hanging") {
      const auto previous =
          recompose::detail::set_out_of_order_patience(std::chrono::milliseconds(200));
      Rendezvous both_hold(2);
      std::atomic<bool> other_got_high{false};
      std::thread other([&] {
        ModuleStateLocks outer({low});
        both_hold.meet(std::chrono::seconds(5));
        ModuleStateLocks inner({high});  // in order: waits until the main thread lets go
        other_got_high = true;
      });
      std::optional<std::string> error;
      {
        ModuleStateLocks outer({high});
        both_hold.meet(std::chrono::seconds(5));
        try {
          ModuleStateLocks inner({low});  // below `high`, held by the other thread: rule 3
        } catch (const recompose::CheckpointError& e) {
          error = e.what();
        }
        CHECK_FALSE(other_got_high.load());
      }
      other.join();
      recompose::detail::set_out_of_order_patience(previous);
      REQUIRE(error.has_value());
      CHECK(error->find("Module state locks") != std::string::npos);
      CHECK(other_got_high.load());
    }
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
