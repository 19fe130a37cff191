// The composable form: apply_checkpoint on annotated modules.
#include "support/grad_check.h"
#include "support/test_modules.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <sstream>
#include <thread>

using recompose::CheckpointOptions;

namespace {

struct StackImpl : torch::nn::Module {
  explicit StackImpl(int64_t layers, int64_t width = 16) {
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), rt::TinyBlock(width)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x) + x;
    return x;
  }
  std::vector<rt::TinyBlock> blocks;
};
TORCH_MODULE(Stack);

Stack make_stack(int64_t layers, uint64_t seed) {
  torch::manual_seed(seed);
  return Stack(layers);
}

}  // namespace

TEST_CASE("apply_checkpoint: gradients equal, each block recomputed once, nothing else changes") {
  Stack plain = make_stack(4, 21), ckpt = make_stack(4, 21);
  torch::Tensor x = torch::randn({8, 16});
  for (auto& b : ckpt->blocks) recompose::apply_checkpoint(b);
  CHECK(recompose::is_checkpointed(ckpt->blocks[0]));
  CHECK(recompose::hooks::applied_apis(*ckpt->blocks[0]) ==
        std::vector<std::string>{recompose::kCheckpointApi});

  auto g_plain = rt::grads_of([&] { return plain(x).pow(2).sum(); }, plain->parameters());
  auto g_ckpt = rt::grads_of([&] { return ckpt(x).pow(2).sum(); }, ckpt->parameters());
  CHECK(rt::bitwise_equal(g_plain, g_ckpt));
  for (auto& b : ckpt->blocks) CHECK(b->body_runs == 2);

  std::vector<std::string> n1, n2;
  for (const auto& p : plain->named_parameters()) n1.push_back(p.key());
  for (const auto& p : ckpt->named_parameters()) n2.push_back(p.key());
  CHECK(n1 == n2);
  std::stringstream s1, s2;
  torch::save(plain, s1);
  torch::save(ckpt, s2);
  CHECK(s1.str().size() == s2.str().size());
}

TEST_CASE("apply_checkpoint: bytes held for backward fall to about 1/L plus the blocks' inputs") {
  constexpr int64_t L = 8;
  Stack plain = make_stack(L, 22), ckpt = make_stack(L, 22);
  for (auto& b : ckpt->blocks) recompose::apply_checkpoint(b);
  torch::Tensor x = torch::randn({32, 16});
  int64_t plain_bytes = 0, ckpt_bytes = 0;
  {
    recompose::SavedTensorMeter meter;
    auto loss = plain(x).sum();
    plain_bytes = meter.bytes_held();
  }
  {
    recompose::SavedTensorMeter meter;
    auto loss = ckpt(x).sum();
    ckpt_bytes = meter.bytes_held();
  }
  // Each TinyBlock saves its input (for the linear) and its tanh output: two activations per
  // block; checkpointed, only the block input is held.
  const int64_t activation = x.numel() * static_cast<int64_t>(sizeof(float));
  CHECK(plain_bytes == 2 * L * activation);
  CHECK(ckpt_bytes == L * activation);
}

TEST_CASE("apply_checkpoint: other owners' hooks run during recomputation and can tell") {
  Stack ckpt = make_stack(2, 23);
  auto& block = ckpt->blocks[1];
  std::vector<bool> recomputing;
  recompose::hooks::register_forward_pre_hook(
      *block,
      [&](recompose::hooks::ForwardCall&) { recomputing.push_back(recompose::is_recomputing()); },
      recompose::hooks::HookOptions().owner("trainer"));
  recompose::apply_checkpoint(block);
  ckpt(torch::randn({2, 16})).sum().backward();
  CHECK(recomputing == std::vector<bool>{false, true});
}

TEST_CASE("apply_checkpoint: misuse is refused clearly") {
  rt::TinyBlock block(4);
  recompose::apply_checkpoint(block);
  CHECK_THROWS_AS(recompose::apply_checkpoint(block), recompose::hooks::CompositionError);
  rt::Plain plain;
  CHECK_THROWS_WITH_AS(recompose::apply_checkpoint(plain), doctest::Contains("RECOMPOSE_FORWARD"),
                       std::invalid_argument);
  CHECK_FALSE(recompose::is_checkpointed(plain));
  CHECK(recompose::remove_checkpoint(block));
  CHECK_FALSE(recompose::remove_checkpoint(block));
  CHECK_FALSE(recompose::is_checkpointed(block));
  CHECK(recompose::hooks::hook_count(*block) == 0);
  // after removal the block runs plainly
  torch::Tensor x = torch::randn({1, 4});
  block(x).sum().backward();
  CHECK(block->body_runs == 1);
}

TEST_CASE("apply_checkpoint: the module stays alive as long as the graph needs it") {
  torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  torch::Tensor loss;
  std::weak_ptr<torch::nn::Module> weak;
  {
    rt::TinyBlock block(4);
    weak = block.ptr();
    recompose::apply_checkpoint(block);
    loss = block(x).sum();
  }
  CHECK_FALSE(weak.expired());
  loss.backward();
  CHECK(x.grad().defined());
  loss = torch::Tensor();
  CHECK(weak.expired());
}

TEST_CASE("apply_checkpoint: an exception in the block's body leaves no region behind") {
  rt::Throwing m;
  recompose::apply_checkpoint(m);
  torch::Tensor x = torch::randn({2}, torch::requires_grad());
  CHECK_THROWS_WITH(m(x, true), "body failed");
  CHECK_FALSE(recompose::is_checkpointing());
  auto g = rt::grads_of([&] { return m(x, false).sum(); }, {x});
  CHECK(torch::equal(g[0], torch::full({2}, 2.0f)));
}

TEST_CASE("apply_checkpoint: all argument kinds are recomputed with the saved inputs") {
  torch::manual_seed(24);
  rt::MixedArgs plain, ckpt;
  recompose::apply_checkpoint(ckpt);
  torch::Tensor x = torch::randn({3}, torch::requires_grad()),
                b = torch::randn({3}, torch::requires_grad()),
                e = torch::randn({3}, torch::requires_grad()),
                s = torch::randn({3}, torch::requires_grad());
  auto run = [&](rt::MixedArgs& m) {
    return (m(x.sin(), b.cos(), std::vector<torch::Tensor>{e.exp()}, std::make_tuple(s.tanh(), 0.5),
              std::make_pair(int64_t{2}, std::string("t")), rt::Mode::Mul) *
            x)
        .sum();
  };
  auto g1 = rt::grads_of([&] { return run(plain); }, {x, b, e, s});
  auto g2 = rt::grads_of([&] { return run(ckpt); }, {x, b, e, s});
  CHECK(rt::bitwise_equal(g1, g2));
}

TEST_CASE("apply_checkpoint: nested checkpointed modules") {
  torch::manual_seed(25);
  rt::Nested plain, ckpt;
  torch::manual_seed(25);
  plain = rt::Nested();
  torch::manual_seed(25);
  ckpt = rt::Nested();
  recompose::apply_checkpoint(ckpt);
  recompose::apply_checkpoint(ckpt->a);
  torch::Tensor x = torch::randn({2, 4});
  auto g1 = rt::grads_of([&] { return plain(x).sum(); }, plain->parameters());
  auto g2 = rt::grads_of([&] { return ckpt(x).sum(); }, ckpt->parameters());
  CHECK(rt::bitwise_equal(g1, g2));
}

TEST_CASE("apply_checkpoint: forward and backward on several threads at once") {
  Stack ckpt = make_stack(3, 26);
  for (auto& b : ckpt->blocks) recompose::apply_checkpoint(b);
  Stack plain = make_stack(3, 26);
  torch::Tensor x = torch::randn({4, 16});
  // expected input gradient
  torch::Tensor xin = x.clone().requires_grad_(true);
  plain(xin).sum().backward();
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        torch::Tensor xi = x.clone().requires_grad_(true);
        auto g = torch::autograd::grad({ckpt(xi).sum()}, {xi})[0];
        if (!torch::equal(g, xin.grad())) bad.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
}

// Forward signatures of real models: a KV cache as optional<tuple<Tensor, Tensor>>, a vector of
// pairs, and a non-const lvalue reference.
struct KvBlockImpl : torch::nn::Module {
  KvBlockImpl() { fc = register_module("fc", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(torch::Tensor& x,
                        std::optional<std::tuple<torch::Tensor, torch::Tensor>> kv,
                        std::vector<std::pair<torch::Tensor, double>> extra) {
    RECOMPOSE_FORWARD(x, kv, extra);
    auto h = torch::tanh(fc(x));
    if (kv.has_value()) h = h * std::get<0>(*kv) + std::get<1>(*kv);
    for (auto& [t, scale] : extra) h = h + t.sin() * scale;
    return h;
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(KvBlock);

TEST_CASE(
    "apply_checkpoint: optional tuples, vectors of pairs and lvalue references as arguments") {
  auto run = [](bool checkpointed, bool with_cache) {
    torch::manual_seed(3);
    KvBlock block;
    if (checkpointed) recompose::apply_checkpoint(block);
    auto x = torch::randn({4, 6}, torch::requires_grad());
    auto k = torch::randn({4, 6}, torch::requires_grad());
    auto v = torch::randn({4, 6}, torch::requires_grad());
    auto e = torch::randn({4, 6}, torch::requires_grad());
    std::optional<std::tuple<torch::Tensor, torch::Tensor>> kv;
    if (with_cache) kv = std::make_tuple(k, v);
    std::vector<std::pair<torch::Tensor, double>> extra{{e, 0.5}};
    block(x, kv, extra).pow(2).sum().backward();
    return std::vector<torch::Tensor>{x.grad(), with_cache ? k.grad() : torch::Tensor(), e.grad(),
                                      block->fc->weight.grad()};
  };
  for (const bool with_cache : {true, false}) {
    CAPTURE(with_cache);
    CHECK(rt::bitwise_equal(run(false, with_cache), run(true, with_cache)));
  }
}
