// Activation swap (recompose/swap.h) on CPU tensors: host-to-host copies, same logic as on a GPU.
#include <recompose/recompose.h>
#include <recompose/swap.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include "support/grad_check.h"
#include "swap/swap_access.h"  // SwapAccess::core: SwapCore::bookkeeping_entries, for the leak tests
#include "swap/swap_core.h"

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

std::shared_ptr<recompose::SwapManager> test_manager(int64_t prefetch_groups = 1) {
  return recompose::SwapManager::create(
      recompose::SwapOptions().min_bytes(0).prefetch_groups(prefetch_groups));
}

// Linear + ReLU layers; forward opens one swap group per layer when given a manager.
struct Mlp {
  explicit Mlp(int64_t layers, int64_t width = 16) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < layers; ++i) fcs.emplace_back(width, width);
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

int64_t entries(const recompose::SwapManager& manager) {
  return recompose::detail::SwapAccess::core(manager)->bookkeeping_entries();
}

// A loss whose backward needs one saved activation, 2 * x (sin saves its input).
torch::Tensor sin_loss(const torch::Tensor& x) { return (x * 2).sin().sum(); }

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
// Selective policy: every aten::mm output goes to host memory, the rest is recomputed.
recompose::SelectivePolicy swap_mm_policy() {
  return recompose::SelectivePolicy([](const recompose::SelectiveCheckpointContext&,
                                       const c10::OperatorHandle& op, const torch::jit::Stack&) {
    return op.schema().name() == "aten::mm" ? recompose::CheckpointPolicy::MUST_SWAP
                                            : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
  });
}
#endif

}  // namespace

TEST_SUITE_BEGIN("swap");

TEST_CASE("swap: AsyncSaveOnCpu gives bitwise the gradients of the plain forward") {
  Mlp mlp(3);
  torch::manual_seed(1);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto leaves = with(mlp.params(), x);
  const auto plain = rt::grads_of([&] { return mlp.forward(x).pow(2).sum(); }, leaves);

  auto manager = test_manager();
  const auto swapped = rt::grads_of(
      [&] {
        recompose::AsyncSaveOnCpu offload(manager);
        return mlp.forward(x).pow(2).sum();
      },
      leaves);
  CHECK(rt::bitwise_equal(plain, swapped));
  const auto s = manager->stats();
  CHECK(s.tensors_offloaded > 0);
  CHECK(s.bytes_offloaded == s.bytes_reloaded);
  CHECK(s.tensors_offloaded == s.tensors_reloaded);
  // Backward released every saved tensor, so every offload is gone and its buffer pooled.
  CHECK(manager->tensors_alive() == 0);
  CHECK(manager->bytes_alive() == 0);
  CHECK(manager->pool_bytes() == s.bytes_offloaded);
}

TEST_CASE("swap: statistics account for every saved tensor") {
  torch::manual_seed(2);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto w = torch::randn({8, 6}, torch::requires_grad());
  torch::Tensor h, b, v;
  auto forward = [&] {
    h = x.mm(w);       // saves x and w: leaves that require grad (parameters), kept
    auto a = h.sin();  // saves h: offloaded
    b = a.exp();       // saves its result b: offloaded
    v = a.narrow(0, 0, 2);
    auto c = v.cos();  // saves v, a slice of a's storage: kept
    return b.sum() + c.sum();
  };
  const auto plain = rt::grads_of(forward, {x, w});

  auto manager = test_manager();
  torch::Tensor loss;
  {
    recompose::AsyncSaveOnCpu offload(manager);
    loss = forward();
  }
  auto s = manager->stats();
  CHECK(s.tensors_offloaded == 2);
  CHECK(s.bytes_offloaded == static_cast<int64_t>(h.nbytes() + b.nbytes()));
  CHECK(s.tensors_kept == 3);
  CHECK(s.bytes_kept == static_cast<int64_t>(x.nbytes() + w.nbytes() + v.nbytes()));
  CHECK(s.tensors_reloaded == 0);
  CHECK(manager->tensors_alive() == 2);
  CHECK(manager->bytes_alive() == s.bytes_offloaded);

  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  loss.backward();
  loss = torch::Tensor();
  s = manager->stats();
  CHECK(s.bytes_reloaded == s.bytes_offloaded);
  CHECK(s.tensors_reloaded == 2);
  CHECK(s.sync_loads + s.prefetched == s.tensors_reloaded);
  CHECK(s.pool_misses == 2);
  CHECK(s.pool_hits == 0);
  CHECK(manager->tensors_alive() == 0);
  CHECK(rt::bitwise_equal(plain, {x.grad(), w.grad()}));
}

TEST_CASE("swap: the size threshold and the filter keep tensors on the device") {
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto run = [&](const std::shared_ptr<recompose::SwapManager>& manager) {
    recompose::AsyncSaveOnCpu offload(manager);
    return (x * 3).sin().exp().sum();
  };
  auto big = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(x.nbytes() + 1));
  auto loss = run(big);
  CHECK(big->stats().tensors_offloaded == 0);
  CHECK(big->stats().tensors_kept == 2);
  loss.backward();

  auto filtered = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0).filter(
      [](const at::Tensor& t) { return t.dim() != 2; }));
  loss = run(filtered);
  CHECK(filtered->stats().tensors_offloaded == 0);
  CHECK(filtered->stats().tensors_kept == 2);
  loss.backward();
}

TEST_CASE("swap: eligibility rules") {
  auto manager = test_manager();
  auto param = torch::randn({4, 4}, torch::requires_grad());
  CHECK_FALSE(manager->eligible(param));
  CHECK_FALSE(manager->eligible(param.t()));  // view of a parameter
  auto act = param * 2;
  CHECK(manager->eligible(act));
  CHECK(manager->eligible(act.t()));  // covers its whole storage: offloading it frees it
  CHECK_FALSE(manager->eligible(act.narrow(0, 1, 2)));  // a slice frees nothing
  CHECK_FALSE(manager->eligible(torch::ones({1}).expand({8})));
  CHECK_FALSE(manager->eligible(torch::Tensor()));
  CHECK_FALSE(manager->eligible(torch::empty({0})));
  auto default_threshold = recompose::SwapManager::create();
  CHECK_FALSE(default_threshold->eligible(torch::randn({16, 16})));  // 1 KiB < 1 MiB
  CHECK(default_threshold->eligible(torch::randn({512, 512})));      // 1 MiB
}

TEST_CASE("swap: offload and get keep values, sizes and strides") {
  auto manager = test_manager();
  auto t = torch::randn({6, 4}).t();  // non-contiguous, dense
  auto swapped = manager->offload(t);
  CHECK(swapped->state() == recompose::SwapState::Offloaded);  // CPU copies are synchronous
  CHECK(swapped->nbytes() == static_cast<int64_t>(t.nbytes()));
  CHECK(swapped->device() == t.device());
  auto back = swapped->get();
  CHECK(torch::equal(back, t));
  CHECK(back.strides() == t.strides());
  CHECK(back.data_ptr() != t.data_ptr());
  CHECK_FALSE(back.requires_grad());
  // A slice is copied alone and comes back contiguous.
  auto slice = torch::arange(10.0).narrow(0, 2, 3);
  CHECK(torch::equal(manager->offload(slice)->get(), slice));
}

TEST_CASE("swap: backward of group i reloads group i-1 ahead (prefetch order)") {
  for (int64_t lookahead : {0, 1, 2}) {
    CAPTURE(lookahead);
    auto manager = test_manager(lookahead);
    std::vector<torch::Tensor> originals;
    std::vector<std::shared_ptr<recompose::SwappedTensor>> swapped;
    for (int i = 0; i < 4; ++i) {
      recompose::SwapGroupScope group(*manager);
      originals.push_back(torch::full({3}, static_cast<double>(i)));
      swapped.push_back(manager->offload(originals.back()));
      CHECK(swapped.back()->group() == group.id());
    }
    using S = recompose::SwapState;
    for (auto& s : swapped) CHECK(s->state() == S::Offloaded);
    // Backward reaches group 3 first: it is loaded on demand, groups 2 .. 3-lookahead ahead.
    CHECK(torch::equal(swapped[3]->get(), originals[3]));
    CHECK(manager->stats().sync_loads == 1);
    CHECK(manager->stats().prefetched == lookahead);
    CHECK(swapped[2]->state() == (lookahead >= 1 ? S::Reloaded : S::Offloaded));
    CHECK(swapped[1]->state() == (lookahead >= 2 ? S::Reloaded : S::Offloaded));
    CHECK(swapped[0]->state() == S::Offloaded);
    CHECK(swapped[3]->state() == S::Offloaded);  // its only user has it; the host copy stays
    for (int i = 2; i >= 0; --i) CHECK(torch::equal(swapped[i]->get(), originals[i]));
    const auto s = manager->stats();
    CHECK(s.tensors_reloaded == 4);
    CHECK(s.sync_loads == (lookahead == 0 ? 4 : 1));
    CHECK(s.prefetched == (lookahead == 0 ? 0 : 3));
  }
}

TEST_CASE("swap: per-layer groups in a real backward load only the last group on demand") {
  const int64_t layers = 4;
  Mlp mlp(layers);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto leaves = with(mlp.params(), x);
  const auto plain = rt::grads_of([&] { return mlp.forward(x).sum(); }, leaves);
  for (int64_t lookahead : {0, 1}) {
    CAPTURE(lookahead);
    auto manager = test_manager(lookahead);
    const auto swapped = rt::grads_of(
        [&] {
          recompose::AsyncSaveOnCpu offload(manager);
          return mlp.forward(x, manager.get()).sum();
        },
        leaves);
    CHECK(rt::bitwise_equal(plain, swapped));
    const auto s = manager->stats();
    CHECK(s.groups == layers);
    // Each ReLU output is saved twice (by ReLU and by the next Linear): one copy, shared.
    CHECK(s.tensors_offloaded == layers);
    CHECK(s.shared_offloads == layers - 1);
    CHECK(s.tensors_reloaded == layers);
    CHECK(s.sync_loads == (lookahead == 0 ? layers : 1));
    CHECK(s.sync_loads + s.prefetched == s.tensors_reloaded);
  }
}

TEST_CASE("swap: implicit groups split by size without explicit groups") {
  // Every tensor is larger than the limit: one implicit group each.
  auto manager =
      recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0).implicit_group_bytes(1));
  Mlp mlp(3);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  {
    recompose::AsyncSaveOnCpu offload(manager);
    auto loss = mlp.forward(x).sum();
    CHECK(manager->stats().groups == 3);
    loss.backward();
  }
  CHECK(manager->stats().sync_loads == 1);
  // One group for the whole model: everything is loaded when backward starts.
  auto one_group = test_manager();
  {
    recompose::AsyncSaveOnCpu offload(one_group);
    auto loss = mlp.forward(x).sum();
    CHECK(one_group->stats().groups == 1);
    loss.backward();
  }
  CHECK(one_group->stats().sync_loads == 1);
  CHECK(one_group->stats().prefetched == 2);
}

TEST_CASE("swap: a tensor asked for before its reload was launched is loaded synchronously") {
  auto manager = test_manager(/*prefetch_groups=*/0);
  auto t = torch::randn({5, 5});
  auto swapped = manager->offload(t);
  CHECK(swapped->state() == recompose::SwapState::Offloaded);
  CHECK(torch::equal(swapped->get(), t));
  CHECK(manager->stats().sync_loads == 1);
  CHECK(manager->stats().prefetched == 0);
  // prefetch() launches it ahead; get() then needs no new load.
  swapped->prefetch();
  CHECK(swapped->state() == recompose::SwapState::Reloaded);
  CHECK(torch::equal(swapped->get(), t));
  CHECK(manager->stats().sync_loads == 1);
  CHECK(manager->stats().prefetched == 1);
  // From another thread (an autograd device thread on a GPU).
  torch::Tensor from_thread;
  std::thread([&] { from_thread = swapped->get(); }).join();
  CHECK(torch::equal(from_thread, t));
  CHECK(manager->stats().sync_loads == 2);
}

TEST_CASE("swap: a saved tensor modified in place is an error at backward") {
  auto x = torch::randn({4, 4}, torch::requires_grad());
  SUBCASE("offloaded") {
    auto manager = test_manager();
    torch::Tensor loss;
    {
      recompose::AsyncSaveOnCpu offload(manager);
      auto h = x * 2;
      loss = h.sin().sum();
      h.add_(1);
    }
    CHECK(manager->stats().tensors_offloaded == 1);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("modified by an inplace operation"),
                         recompose::CheckpointError);
  }
  SUBCASE("kept on the device") {
    auto manager = recompose::SwapManager::create();  // 1 MiB threshold: kept
    torch::Tensor loss;
    {
      recompose::AsyncSaveOnCpu offload(manager);
      auto h = x * 2;
      loss = h.sin().sum();
      h.mul_(3);
    }
    CHECK(manager->stats().tensors_kept == 1);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("is at version 1; expected version 0"),
                         recompose::CheckpointError);
  }
}

TEST_CASE("swap: host buffers are reused from the pool on the next step") {
  Mlp mlp(3);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto step = [&](const std::shared_ptr<recompose::SwapManager>& manager) {
    torch::Tensor loss;
    {
      recompose::AsyncSaveOnCpu offload(manager);
      loss = mlp.forward(x, manager.get()).sum();
    }
    loss.backward();
  };
  auto manager = test_manager();
  step(manager);
  const auto first = manager->stats();
  CHECK(first.pool_hits == 0);
  CHECK(first.pool_misses == first.tensors_offloaded);
  CHECK(manager->pool_bytes() == first.bytes_offloaded);
  step(manager);
  const auto second = manager->stats();
  CHECK(second.pool_hits == first.tensors_offloaded);
  CHECK(second.pool_misses == first.pool_misses);
  manager->clear_pool();
  CHECK(manager->pool_bytes() == 0);

  auto unpooled =
      recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0).max_pool_bytes(0));
  step(unpooled);
  step(unpooled);
  CHECK(unpooled->stats().pool_hits == 0);
  CHECK(unpooled->pool_bytes() == 0);
}

TEST_CASE("swap: backward twice with retain_graph reloads again") {
  auto manager = test_manager();
  auto x = torch::randn({4, 4}, torch::requires_grad());
  torch::Tensor loss;
  {
    recompose::AsyncSaveOnCpu offload(manager);
    loss = (x * 2).sin().sum();
  }
  loss.backward({}, /*retain_graph=*/true);
  auto once = x.grad().clone();
  loss.backward();
  CHECK(torch::allclose(x.grad(), 2 * once));
  CHECK(manager->stats().tensors_reloaded == 2);
  CHECK(manager->stats().tensors_offloaded == 1);
}

TEST_CASE("swap: offloaded tensors outlive their manager handle") {
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto manager = test_manager();
  torch::Tensor loss;
  {
    recompose::AsyncSaveOnCpu offload(manager);
    loss = (x * 2).sin().sum();
  }
  manager.reset();
  loss.backward();
  CHECK(torch::allclose(x.grad(), 2 * (x * 2).cos()));
}

TEST_CASE("swap: misuse gives clear errors") {
  auto manager = test_manager();
  CHECK_THROWS_AS(manager->offload(torch::Tensor()), recompose::CheckpointError);
  CHECK_THROWS_WITH_AS(manager->end_group(0), doctest::Contains("not the innermost open group"),
                       recompose::CheckpointError);
  const int64_t outer = manager->begin_group();
  const int64_t inner = manager->begin_group();
  CHECK(inner > outer);
  CHECK_THROWS_AS(manager->end_group(outer), recompose::CheckpointError);
  manager->end_group(inner);
  manager->end_group(outer);
  auto swapped = manager->offload(torch::ones({3}));
  swapped->release();
  CHECK(swapped->state() == recompose::SwapState::Released);
  CHECK_THROWS_WITH_AS(swapped->get(), doctest::Contains("released"), recompose::CheckpointError);
  CHECK_THROWS_AS(recompose::SwapManager::create(recompose::SwapOptions().prefetch_groups(-1)),
                  std::invalid_argument);  // an argument error (see the SwapOptions case below)
}

TEST_CASE("swap: swap_inputs offloads the inputs of a checkpointed region") {
  Mlp mlp(2);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto leaves = with(mlp.params(), x);
  auto body = [&](const torch::Tensor& in) { return mlp.forward(in); };
  // The region's input is an activation (x * 2), not a leaf: eligible.
  const auto plain = rt::grads_of([&] { return recompose::checkpoint(body, x * 2).sum(); }, leaves);
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
  CHECK(rt::bitwise_equal(plain, swapped));
  CHECK(manager->stats().bytes_reloaded == manager->stats().bytes_offloaded);
  CHECK(manager->tensors_alive() == 0);
}

TEST_CASE("swap: AsyncSaveOnCpu does not offload what a checkpointed region recomputes") {
  Mlp mlp(2);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto leaves = with(mlp.params(), x);
  auto body = [&](const torch::Tensor& in) { return mlp.forward(in); };
  const auto plain = rt::grads_of([&] { return recompose::checkpoint(body, x * 2).sum(); }, leaves);
  auto manager = test_manager();
  const auto swapped = rt::grads_of(
      [&] {
        recompose::AsyncSaveOnCpu offload(manager);
        return recompose::checkpoint(body, x * 2).sum();
      },
      leaves);
  CHECK(rt::bitwise_equal(plain, swapped));
  // Only the region's input (x * 2) is saved outside the region: x * 2 saves nothing of size.
  CHECK(manager->stats().tensors_offloaded == 1);
  CHECK(manager->stats().bytes_reloaded == manager->stats().bytes_offloaded);
}

// ---- Bookkeeping is freed with the tensors (no growth across steps) ----

TEST_CASE("swap: bookkeeping returns to its baseline after every step (explicit manager)") {
  Mlp mlp(3);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  for (bool grouped : {false, true}) {
    CAPTURE(grouped);
    // implicit_group_bytes(1): one implicit group per tensor when no explicit group is open.
    auto manager = recompose::SwapManager::create(
        recompose::SwapOptions().min_bytes(0).implicit_group_bytes(1));
    const int64_t baseline = entries(*manager);
    for (int step = 0; step < 5; ++step) {
      CAPTURE(step);
      torch::Tensor loss;
      {
        recompose::AsyncSaveOnCpu offload(manager);
        loss = mlp.forward(x, grouped ? manager.get() : nullptr).sum();
      }
      CHECK(entries(*manager) > baseline);  // the counter sees the offloads of this step
      loss.backward();
      loss = torch::Tensor();
      CHECK(manager->tensors_alive() == 0);
      CHECK(entries(*manager) == baseline);
    }
    CHECK(manager->stats().tensors_offloaded == 5 * 3);
  }
}

TEST_CASE("swap: bookkeeping returns to its baseline after every step (default manager)") {
  // The default manager keeps tensors under 1 MiB on the device: 512 x 512 floats are 1 MiB.
  torch::manual_seed(4);
  torch::nn::Linear fc1(512, 512), fc2(512, 512);
  auto x = torch::randn({512, 512});
  auto manager = recompose::SwapManager::default_manager();
  const int64_t baseline = entries(*manager);
  const int64_t offloaded_before = manager->stats().tensors_offloaded;
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    torch::Tensor loss;
    {
      recompose::AsyncSaveOnCpu offload;
      loss = fc2->forward(torch::relu(fc1->forward(x))).sum();
    }
    loss.backward();
    loss = torch::Tensor();
    CHECK(entries(*manager) == baseline);
  }
  CHECK(manager->stats().tensors_offloaded > offloaded_before);
}

TEST_CASE("swap: a released tensor leaves no bookkeeping behind") {
  auto manager = test_manager();
  const int64_t baseline = entries(*manager);
  auto t = torch::randn({4});
  auto swapped = manager->offload(t);
  CHECK(entries(*manager) > baseline);
  swapped->release();
  CHECK(entries(*manager) == baseline);
  swapped.reset();
  CHECK(entries(*manager) == baseline);
}

// ---- Misuse of scopes and managers: clear errors, no crash, no hang ----

TEST_CASE("swap: saved-tensor scopes closed out of order are reported and leave nothing dangling") {
  auto x = torch::randn({4, 4}, torch::requires_grad());
  SUBCASE("two AsyncSaveOnCpu with two managers, the outer one closed first") {
    auto first = test_manager();
    auto second = test_manager();
    auto outer = std::make_unique<recompose::AsyncSaveOnCpu>(first);
    auto inner = std::make_unique<recompose::AsyncSaveOnCpu>(second);
    outer.reset();  // not LIFO
    first.reset();  // and the outer scope's manager is gone
    CHECK_THROWS_WITH_AS(sin_loss(x), doctest::Contains("out of order"),
                         recompose::CheckpointError);
    // Reported once; the inner scope still offloads through its own manager.
    auto loss = sin_loss(x);
    CHECK(second->stats().tensors_offloaded == 1);
    inner.reset();
    loss.backward();
    CHECK(torch::equal(x.grad(), 2 * (x * 2).cos()));
  }
  SUBCASE("a SavedTensorMeter closed while an AsyncSaveOnCpu opened after it is open") {
    auto manager = test_manager();
    auto meter = std::make_unique<recompose::SavedTensorMeter>();
    auto offload = std::make_unique<recompose::AsyncSaveOnCpu>(manager);
    meter.reset();  // not LIFO
    CHECK_THROWS_WITH_AS(sin_loss(x), doctest::Contains("recompose::SavedTensorMeter"),
                         recompose::CheckpointError);
    auto loss = sin_loss(x);
    offload.reset();
    loss.backward();
    CHECK(manager->stats().tensors_offloaded == 1);
    CHECK(torch::equal(x.grad(), 2 * (x * 2).cos()));
  }
  SUBCASE("a new scope opened after an out-of-order close reports it too") {
    auto manager = test_manager();
    auto meter = std::make_unique<recompose::SavedTensorMeter>();
    auto offload = std::make_unique<recompose::AsyncSaveOnCpu>(manager);
    meter.reset();
    CHECK_THROWS_WITH_AS(recompose::SavedTensorMeter(), doctest::Contains("LIFO"),
                         recompose::CheckpointError);
    recompose::SavedTensorMeter meter2;  // reported once: the next scope opens normally
    auto loss = sin_loss(x);
    CHECK(meter2.tensors_held() == 1);
  }
  SUBCASE("an AsyncSaveOnCpu closed on another thread than the one that opened it") {
    auto manager = test_manager();
    std::optional<recompose::AsyncSaveOnCpu> offload;
    offload.emplace(manager);
    std::thread([&] { offload.reset(); }).join();
    manager.reset();  // the scope's manager is gone
    CHECK_THROWS_WITH_AS(sin_loss(x), doctest::Contains("another thread"),
                         recompose::CheckpointError);
    sin_loss(x).backward();  // the scope is closed: a plain save
    CHECK(torch::equal(x.grad(), 2 * (x * 2).cos()));
  }
}

TEST_CASE("swap: a manager destroyed while its group scope is open leaves nothing dangling") {
  auto manager = test_manager();
  auto t = torch::randn({3, 3});
  auto group = std::make_unique<recompose::SwapGroupScope>(*manager);
  const int64_t id = group->id();
  auto swapped = manager->offload(t);
  manager.reset();
  group.reset();  // closes a group of a manager whose last handle is gone
  CHECK(swapped->group() == id);
  CHECK(torch::equal(swapped->get(), t));
}

TEST_CASE("swap: two threads with a manager each swap concurrently, with the plain gradients") {
  Mlp mlp(3);
  auto x = torch::randn({8, 16});
  const auto params = mlp.params();
  auto grads = [&](std::shared_ptr<recompose::SwapManager> manager) {
    auto input = x.detach().requires_grad_();
    torch::Tensor loss;
    {
      std::optional<recompose::AsyncSaveOnCpu> offload;
      if (manager) offload.emplace(manager);
      loss = mlp.forward(input, manager.get()).pow(2).sum();
    }
    // autograd::grad, not backward: the threads share the parameters, whose .grad would race.
    return torch::autograd::grad({loss}, with(params, input));
  };
  const auto plain = grads(nullptr);
  std::vector<std::shared_ptr<recompose::SwapManager>> managers{test_manager(), test_manager()};
  std::vector<int> equal(managers.size(), 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < managers.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int step = 0; step < 20; ++step)
        equal[i] += rt::bitwise_equal(grads(managers[i]), plain);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < managers.size(); ++i) {
    CAPTURE(i);
    CHECK(equal[i] == 20);
    CHECK(managers[i]->stats().tensors_offloaded == 20 * 3);
    CHECK(managers[i]->stats().groups == 20 * 3);
    CHECK(managers[i]->tensors_alive() == 0);
  }
}

TEST_CASE("swap: two threads sharing one manager keep their groups apart") {
  Mlp mlp(3);
  auto x = torch::randn({8, 16});
  const auto params = mlp.params();
  auto manager = test_manager();
  const int64_t baseline = entries(*manager);
  auto grads = [&](bool swap) {
    auto input = x.detach().requires_grad_();
    torch::Tensor loss;
    {
      std::optional<recompose::AsyncSaveOnCpu> offload;
      if (swap) offload.emplace(manager);
      loss = mlp.forward(input, swap ? manager.get() : nullptr).pow(2).sum();  // a group per layer
    }
    return torch::autograd::grad({loss}, with(params, input));
  };
  const auto plain = grads(false);
  std::vector<int> equal(2, 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < equal.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int step = 0; step < 20; ++step) equal[i] += rt::bitwise_equal(grads(true), plain);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(equal == std::vector<int>{20, 20});
  CHECK(manager->stats().groups == 2 * 20 * 3);
  CHECK(manager->tensors_alive() == 0);
  CHECK(entries(*manager) == baseline);  // every group was closed by the thread that opened it
}

TEST_CASE("swap: a group scope closed out of order is closed anyway") {
  auto manager = test_manager();
  auto t = torch::randn({3});
  auto outer = std::make_unique<recompose::SwapGroupScope>(*manager);
  auto inner = std::make_unique<recompose::SwapGroupScope>(*manager);
  const int64_t outer_id = outer->id();
  const int64_t inner_id = inner->id();
  outer.reset();  // not LIFO: warns, and closes it
  CHECK(manager->offload(t)->group() == inner_id);
  inner.reset();
  const auto after = manager->offload(t);
  CHECK(after->group() != outer_id);  // not collected by a group left open
  CHECK(after->group() > inner_id);   // an implicit group
}

TEST_CASE("swap: negative sizes in SwapOptions are rejected") {
  using recompose::SwapManager;
  using recompose::SwapOptions;
  CHECK_THROWS_WITH_AS(SwapManager::create(SwapOptions().implicit_group_bytes(-1)),
                       doctest::Contains("implicit_group_bytes"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(SwapManager::create(SwapOptions().max_pool_bytes(-2)),
                       doctest::Contains("max_pool_bytes"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(SwapManager::create(SwapOptions().min_bytes(-1)),
                       doctest::Contains("min_bytes"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(SwapManager::create(SwapOptions().prefetch_groups(-1)),
                       doctest::Contains("prefetch_groups"), std::invalid_argument);
  CHECK(SwapManager::create(SwapOptions().max_pool_bytes(-1))->options().max_pool_bytes() ==
        -1);  // no limit
}

// ---- recompose's own swap ops are invisible to selective checkpointing ----

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
TEST_CASE("swap: nested selective regions that both MUST_SWAP mm give the plain gradients") {
  auto manager = test_manager();
  auto options = recompose::CheckpointOptions().swap_manager(manager);
  options.policy(swap_mm_policy());
  torch::manual_seed(5);
  auto a = torch::randn({4, 6}, torch::requires_grad());
  auto b = torch::randn({6, 5}, torch::requires_grad());
  auto c = torch::randn({5, 3}, torch::requires_grad());
  auto inner = [](const torch::Tensor& h, const torch::Tensor& w) {
    return torch::mm(h, w).tanh();
  };
  auto outer = [&](bool ckpt) {
    return [&, ckpt](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
      torch::Tensor h = torch::mm(a, b).sin();
      torch::Tensor k = ckpt ? recompose::checkpoint(options, inner, h, c) : inner(h, c);
      return torch::mm(k, k.t()).cos();
    };
  };
  const auto plain = rt::grads_of([&] { return outer(false)(a, b, c).sum(); }, {a, b, c});
  std::vector<torch::Tensor> swapped;
  REQUIRE_NOTHROW(
      swapped = rt::grads_of(
          [&] { return recompose::checkpoint(options, outer(true), a, b, c).sum(); }, {a, b, c}));
  CHECK(rt::bitwise_equal(plain, swapped));
  CHECK(manager->stats().tensors_offloaded > 0);
  CHECK(manager->stats().bytes_reloaded > 0);
}
#endif  // RECOMPOSE_TEST_NO_SELECTIVE

// ---- the public types are handles over state kept in lib/swap ----

// SwapManager exposes no accessor to its internals, and SwappedTensor holds only its core and its
// entry (before: the manager had core() and the tensor 14 state fields in the public header).
template <class M>
concept HasCoreAccessor = requires(const M& m) {
  m.core();
};
static_assert(!HasCoreAccessor<recompose::SwapManager>);
static_assert(sizeof(recompose::SwappedTensor) <=
              sizeof(std::weak_ptr<int>) + sizeof(std::shared_ptr<int>) + sizeof(void*));

TEST_CASE(
    "swap: a SwappedTensor is a handle: its entry goes with its last reference, shared or not") {
  auto manager = test_manager();
  const int64_t baseline = entries(*manager);
  torch::Tensor t = torch::arange(16, torch::kFloat);
  auto first = manager->offload(t);
  auto second = manager->offload(t);  // the same storage, version and shape: shares the copy
  CHECK(first == second);
  CHECK(manager->stats().shared_offloads == 1);
  CHECK(first->nbytes() == 64);
  CHECK(first->device() == torch::Device(torch::kCPU));
  CHECK(first->group() == second->group());
  CHECK(first->state() == recompose::SwapState::Offloaded);
  first.reset();
  CHECK(torch::equal(second->get(), t));
  CHECK(manager->tensors_alive() == 1);
  second.reset();
  CHECK(manager->tensors_alive() == 0);
  CHECK(entries(*manager) == baseline);
}

TEST_CASE(
    "swap: threads offloading, sharing, reading and dropping the same tensors leave nothing "
    "behind") {
  auto manager = test_manager();
  const int64_t baseline = entries(*manager);
  const std::vector<torch::Tensor> sources = {torch::arange(32, torch::kFloat), torch::ones({8, 8}),
                                              torch::full({5}, 3.0)};
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 200; ++i) {
        // Shared with the other threads (their offloads of it may share one copy): read, dropped.
        const torch::Tensor& src = sources[(i + w) % sources.size()];
        auto swapped = manager->offload(src);
        if (!torch::equal(swapped->get(), src)) ++mismatches;
        // This thread's own: released by hand every third time, else dropped.
        torch::Tensor mine = torch::full({16}, static_cast<float>(w * 1000 + i));
        auto own = manager->offload(mine);
        if (!torch::equal(own->get(), mine)) ++mismatches;
        if (i % 3 == 0) own->release();
        if (i % 7 == 0) manager->poll();
        (void)manager->stats();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches.load() == 0);
  CHECK(manager->tensors_alive() == 0);
  CHECK(entries(*manager) == baseline);
}

TEST_SUITE_END();
