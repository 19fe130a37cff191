// Swap and CUDA graph capture (pytorch#193982, #193993): swap records no stream uses with the
// caching allocator; it holds device tensors another stream may still read (DeferredRelease) and
// refuses to copy inside a capture. See Note [ Swap copies and graph capture ].
//
// The release rules run on CPU with a fence the test completes; the capture cases need a CUDA
// device and skip themselves, visibly, without one (as cuda_test.cpp's).
#include "swap/deferred_release.h"
#include "swap/stream_capture.h"

#include <recompose/checkpoint_error.h>
#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace {

// A fence that completes when the test says so (or when waited for); remembers where it was
// recorded.
struct TestFence {
  static std::shared_ptr<TestFence> record(const c10::Stream& stream) {
    auto fence = std::make_shared<TestFence>();
    fence->stream = stream;
    recorded().push_back(fence);
    return fence;
  }
  static std::vector<std::shared_ptr<TestFence>>& recorded() {
    static std::vector<std::shared_ptr<TestFence>> fences;
    return fences;
  }
  bool done() const { return complete; }
  double synchronize() const {
    complete = true;
    return 0;
  }
  std::optional<c10::Stream> stream;
  mutable bool complete = false;
};

using Release = recompose::detail::DeferredReleaseOf<TestFence>;

const c10::Stream kConsumer(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
const c10::Stream kOtherConsumer(c10::Stream::UNSAFE, c10::Device(c10::kCPU), 3);

// Whether the TensorImpl `weak` watches is freed.
using Watch = c10::weak_intrusive_ptr<c10::TensorImpl>;
Watch watch(const at::Tensor& t) { return Watch(t.getIntrusivePtr()); }

}  // namespace

TEST_CASE("swap deferred release: an offload's source is held until its copy's fence completes") {
  TestFence::recorded().clear();
  Release release;
  auto fence = std::make_shared<TestFence>();
  at::Tensor source = torch::ones({8});
  const Watch freed = watch(source);
  release.until_complete(std::move(source), fence);
  release.retire();
  CHECK(release.size() == 1);  // the copy may still read it
  CHECK_FALSE(freed.expired());
  fence->complete = true;
  release.retire();
  CHECK(release.size() == 0);
  CHECK(freed.expired());
  CHECK(TestFence::recorded().empty());  // its fence was the copy's: none recorded
}

TEST_CASE(
    "swap deferred release: a reloaded tensor is fenced on its consumers only once nobody else "
    "holds it or its storage") {
  TestFence::recorded().clear();
  Release release;
  at::Tensor reloaded = torch::ones({4, 4});
  at::Tensor autograd_holds = reloaded;   // the same TensorImpl (get() returns it)
  at::Tensor view = reloaded.view({16});  // another TensorImpl on its storage (holds its base)
  // Another TensorImpl on its storage that does not hold the base TensorImpl: only the storage's
  // use count sees it.
  at::Tensor alias = at::empty({0}, reloaded.options());
  alias.set_(reloaded.storage(), 0, {16}, {1});
  const Watch freed = watch(reloaded);
  release.until_unused(std::move(reloaded), {kConsumer, kOtherConsumer});
  release.retire();
  CHECK(TestFence::recorded().empty());  // still used: new work may still read it
  autograd_holds.reset();
  release.retire();
  CHECK(TestFence::recorded().empty());  // the view still shares its storage
  view.reset();
  release.retire();
  CHECK(TestFence::recorded().empty());  // so does the alias
  alias.reset();
  release.retire();
  // Nobody else holds it now: one fence per consumer, recorded on that consumer.
  REQUIRE(TestFence::recorded().size() == 2);
  CHECK(TestFence::recorded()[0]->stream == kConsumer);
  CHECK(TestFence::recorded()[1]->stream == kOtherConsumer);
  CHECK(release.size() == 1);
  TestFence::recorded()[0]->complete = true;
  release.retire();
  CHECK(release.size() == 1);  // the other consumer may still read it
  CHECK_FALSE(freed.expired());
  TestFence::recorded()[1]->complete = true;
  release.retire();
  CHECK(release.size() == 0);
  CHECK(freed.expired());
  CHECK(TestFence::recorded().size() == 2);  // recorded once, not at every retire
}

TEST_CASE("swap deferred release: one tensor still in use does not hold back the others") {
  TestFence::recorded().clear();
  Release release;
  at::Tensor busy = torch::ones({2});
  at::Tensor still_used = busy;
  at::Tensor idle = torch::ones({3});
  const Watch idle_freed = watch(idle);
  release.until_unused(std::move(busy), {kConsumer});
  release.until_unused(std::move(idle), {kConsumer});
  release.retire();
  REQUIRE(TestFence::recorded().size() == 1);  // idle's
  TestFence::recorded()[0]->complete = true;
  release.retire();
  CHECK(idle_freed.expired());
  CHECK(release.size() == 1);
}

TEST_CASE(
    "swap deferred release: drain waits for the fences of what nobody holds, keeps the rest") {
  TestFence::recorded().clear();
  Release release;
  at::Tensor used = torch::ones({2});
  at::Tensor user = used;
  auto copy = std::make_shared<TestFence>();
  release.until_unused(std::move(used), {kConsumer});
  release.until_complete(torch::ones({5}), copy);
  release.until_unused(torch::ones({6}), {kConsumer});
  release.drain();
  CHECK(copy->complete);
  CHECK(release.size() == 1);  // `user` still holds the first
  user.reset();
  release.drain();
  CHECK(release.size() == 0);
}

TEST_CASE("swap capture check: CPU streams are never captured, and swap never refuses there") {
  CHECK_FALSE(recompose::detail::is_capturing(kConsumer));
  CHECK(recompose::detail::may_poll(c10::Device(c10::kCPU)));
  CHECK_NOTHROW(recompose::detail::refuse_under_capture(c10::Device(c10::kCPU), "test"));
}

#ifdef RECOMPOSE_WITH_CUDA
namespace {

bool has_cuda_device() {
  static const bool available = torch::cuda::is_available();
  return available;
}

const c10::Device kCuda(c10::kCUDA, 0);

}  // namespace

TEST_SUITE("cuda" * doctest::skip(!has_cuda_device())) {
  TEST_CASE(
      "cuda swap and graph capture: a reload freed inside a capture, then dropout in it "
      "(pytorch#193993's sequence) captures and replays") {
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    at::cuda::CUDAGraph graph;
    torch::Tensor drawn;
    {
      c10::cuda::CUDAStreamGuard on_capture_stream(capture_stream);
      // Eagerly, on the stream captured next: offload, land, reload. The reloaded tensor is
      // handed to capture_stream (before this change: record_stream'ed on it).
      torch::Tensor activation = torch::randn({1024, 256}, torch::TensorOptions().device(kCuda));
      const torch::Tensor expected = activation.clone();
      std::shared_ptr<recompose::SwappedTensor> swapped = manager->offload(activation);
      activation.reset();
      manager->synchronize();
      REQUIRE(swapped->state() == recompose::SwapState::Offloaded);
      torch::Tensor back = swapped->get();
      CHECK(torch::equal(back, expected));

      graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      // Inside the capture: autograd lets the reloaded tensor and its saved handle go (it used
      // to be freed here with its stream use on the capturing stream), then the capture's
      // first random numbers, which allocate the generator's capture state.
      back.reset();
      swapped.reset();
      drawn = torch::dropout(torch::ones({1 << 14}, torch::TensorOptions().device(kCuda)), 0.5,
                             /*train=*/true);
      // Swap's group scopes and polls do nothing inside a capture.
      { recompose::SwapGroupScope group(*manager); }
      manager->poll();
      REQUIRE_NOTHROW(graph.capture_end());
    }
    graph.replay();
    torch::cuda::synchronize();
    const auto kept = drawn.eq(2).sum().item<int64_t>();
    const auto dropped = drawn.eq(0).sum().item<int64_t>();
    CHECK(kept + dropped == drawn.numel());  // dropout of ones at p = 0.5: 0 or 2
    CHECK(kept > 0);
    CHECK(dropped > 0);
    manager->synchronize();  // outside the capture: the held reload is freed
    CHECK(manager->tensors_alive() == 0);
  }

  TEST_CASE(
      "cuda swap and graph capture: offload, reload, prefetch and synchronize inside a capture "
      "throw CheckpointError saying what to do, and the capture stays valid") {
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    const auto on_device = torch::TensorOptions().device(kCuda);
    torch::Tensor activation = torch::randn({512, 256}, on_device);
    std::shared_ptr<recompose::SwappedTensor> swapped = manager->offload(activation);
    manager->synchronize();
    torch::Tensor leaf = torch::randn({512, 256}, on_device.requires_grad(true));
    torch::Tensor weight = torch::randn({256, 256}, on_device.requires_grad(true));
    torch::Tensor hidden = leaf * 2;  // not a leaf: AsyncSaveOnCpu offloads it
    const c10::cuda::CUDAStream capture_stream = c10::cuda::getStreamFromPool();
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard on_capture_stream(capture_stream);
      graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      const auto says_what_to_do = doctest::Contains("Keep swap out of the captured region");
      CHECK_THROWS_WITH_AS(manager->offload(activation), says_what_to_do,
                           recompose::CheckpointError);
      CHECK_THROWS_WITH_AS(swapped->get(), doctest::Contains("SwappedTensor::get"),
                           recompose::CheckpointError);
      CHECK_THROWS_AS(swapped->prefetch(), recompose::CheckpointError);
      CHECK_THROWS_AS(manager->synchronize(), recompose::CheckpointError);
      {
        recompose::AsyncSaveOnCpu offload(manager);
        CHECK_THROWS_WITH_AS(torch::mm(hidden, weight), says_what_to_do,
                             recompose::CheckpointError);
      }
      REQUIRE_NOTHROW(graph.capture_end());  // nothing was launched: the capture is intact
    }
    graph.replay();
    torch::cuda::synchronize();
    // Outside the capture, swap works again.
    CHECK(torch::equal(swapped->get(), activation));
    CHECK(manager->stats().tensors_offloaded == 1);
  }
}
#endif  // RECOMPOSE_WITH_CUDA
