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

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace {

using recompose::detail::FencePosition;

// A fence that completes when the test says so (or when waited for); remembers where it was
// recorded, in record order, and counts the queries of done().
struct TestFence {
  static std::shared_ptr<TestFence> record(const c10::Stream& stream) {
    auto fence = on(stream);
    recorded().push_back(fence);
    return fence;
  }
  // A fence recorded on `stream` now, outside the release (an offload copy's).
  static std::shared_ptr<TestFence> on(const c10::Stream& stream) {
    static uint64_t next_sequence = 0;
    auto fence = std::make_shared<TestFence>();
    fence->at.emplace(FencePosition{stream, next_sequence++});
    return fence;
  }
  static std::vector<std::shared_ptr<TestFence>>& recorded() {
    static std::vector<std::shared_ptr<TestFence>> fences;
    return fences;
  }
  struct Queries {
    int done = 0;
    int not_done = 0;
  };
  static Queries& queries() {
    static Queries counted;
    return counted;
  }
  bool done() const {
    ++(complete ? queries().done : queries().not_done);
    return complete;
  }
  double synchronize() const {
    complete = true;
    return 0;
  }
  const std::optional<FencePosition>& position() const { return at; }
  std::optional<FencePosition> at;  // none: made complete-able by the test, in no stream's order
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
  CHECK(TestFence::recorded()[0]->at->stream == kConsumer);
  CHECK(TestFence::recorded()[1]->at->stream == kOtherConsumer);
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

namespace {

// `count` tensors held until their fence on `stream` completes, in record order.
struct HeldOnStream {
  HeldOnStream(Release& release, const c10::Stream& stream, int count) {
    for (int i = 0; i < count; ++i) {
      at::Tensor source = torch::ones({i + 1});
      freed.push_back(watch(source));
      fences.push_back(TestFence::on(stream));
      release.until_complete(std::move(source), fences.back());
    }
  }
  int freed_count() const {
    return static_cast<int>(std::ranges::count_if(freed, &Watch::expired));
  }
  std::vector<Watch> freed;
  std::vector<std::shared_ptr<TestFence>> fences;
};

// One retire(), and the queries it made.
TestFence::Queries retire_counting(Release& release) {
  TestFence::queries() = {};
  release.retire();
  return TestFence::queries();
}

}  // namespace

TEST_CASE(
    "swap deferred release: retire queries one fence not done per stream, however many are held "
    "(Note [ Fences complete in record order ])") {
  Release release;
  TestFence::Queries asked;
  HeldOnStream copies(release, kConsumer, 50);
  asked = retire_counting(release);
  CHECK(asked.not_done == 1);  // the oldest: the 49 after it cannot be done
  CHECK(asked.done == 0);
  CHECK(release.size() == 50);
  CHECK(copies.freed_count() == 0);
  const int landed = 7;
  for (int i = 0; i < landed; ++i) copies.fences[i]->complete = true;
  asked = retire_counting(release);
  CHECK(asked.done == landed);
  CHECK(asked.not_done == 1);
  CHECK(release.size() == 50 - landed);
  CHECK(copies.freed_count() == landed);
  for (int i = 0; i < 50; ++i) CHECK(copies.freed[i].expired() == (i < landed));
  asked = retire_counting(release);  // nothing new is done: the released ones are not asked again
  CHECK(asked.done == 0);
  CHECK(asked.not_done == 1);
  for (auto& fence : copies.fences) fence->complete = true;
  release.retire();
  CHECK(release.size() == 0);
  CHECK(copies.freed_count() == 50);
}

TEST_CASE("swap deferred release: retire queries one fence not done on each stream") {
  Release release;
  TestFence::Queries asked;
  HeldOnStream first(release, kConsumer, 20);
  HeldOnStream second(release, kOtherConsumer, 20);
  HeldOnStream first_again(release, kConsumer, 5);  // recorded after all of `second`
  asked = retire_counting(release);
  CHECK(asked.not_done == 2);
  CHECK(asked.done == 0);
  for (int i = 0; i < 3; ++i) first.fences[i]->complete = true;
  for (int i = 0; i < 5; ++i) second.fences[i]->complete = true;
  asked = retire_counting(release);
  CHECK(asked.done == 3 + 5);
  CHECK(asked.not_done == 2);
  CHECK(first.freed_count() == 3);
  CHECK(second.freed_count() == 5);
  CHECK(first_again.freed_count() == 0);
  CHECK(release.size() == 45 - 8);
  // One stream all done, the other not: the done stream's fences are each asked once.
  for (auto& fence : first.fences) fence->complete = true;
  for (auto& fence : first_again.fences) fence->complete = true;
  asked = retire_counting(release);
  CHECK(asked.done == 17 + 5);
  CHECK(asked.not_done == 1);
  CHECK(first.freed_count() == 20);
  CHECK(first_again.freed_count() == 5);
  CHECK(second.freed_count() == 5);
  CHECK(release.size() == 15);
}

TEST_CASE(
    "swap deferred release: a tensor fenced on two streams is freed only when both are done, and "
    "its done fence is asked once") {
  TestFence::recorded().clear();
  Release release;
  TestFence::Queries asked;
  at::Tensor reloaded = torch::ones({4});
  const Watch freed = watch(reloaded);
  release.until_unused(std::move(reloaded), {kConsumer, kOtherConsumer});
  release.retire();
  REQUIRE(TestFence::recorded().size() == 2);
  TestFence::recorded()[0]->complete = true;
  asked = retire_counting(release);
  CHECK(asked.done == 1);
  CHECK(asked.not_done == 1);
  CHECK(release.size() == 1);
  CHECK_FALSE(freed.expired());
  asked = retire_counting(release);
  CHECK(asked.done == 0);  // known done since the last retire
  CHECK(asked.not_done == 1);
  CHECK_FALSE(freed.expired());
  TestFence::recorded()[1]->complete = true;
  release.retire();
  CHECK(freed.expired());
  CHECK(release.size() == 0);
}

TEST_CASE(
    "swap deferred release: a fence recorded late, held before an earlier recorded one, is asked "
    "after it and neither is freed early") {
  TestFence::recorded().clear();
  Release release;
  TestFence::Queries asked;
  at::Tensor late = torch::ones({2});  // held first, fenced last: its user lets go later
  at::Tensor user = late;
  at::Tensor early = torch::ones({3});
  const Watch late_freed = watch(late);
  const Watch early_freed = watch(early);
  release.until_unused(std::move(late), {kConsumer});
  release.until_unused(std::move(early), {kConsumer});
  release.retire();
  REQUIRE(TestFence::recorded().size() == 1);  // early's
  user.reset();
  asked = retire_counting(release);
  REQUIRE(TestFence::recorded().size() == 2);  // late's, recorded after early's
  const auto early_fence = TestFence::recorded()[0];
  const auto late_fence = TestFence::recorded()[1];
  // Neither done: early's, the first recorded, answers for both, though late's is held first.
  CHECK(asked.not_done == 1);
  CHECK(asked.done == 0);
  CHECK(release.size() == 2);
  early_fence->complete = true;
  asked = retire_counting(release);
  CHECK(asked.done == 1);
  CHECK(asked.not_done == 1);
  CHECK(early_freed.expired());
  CHECK_FALSE(late_freed.expired());  // its fence is not done
  CHECK(release.size() == 1);
  late_fence->complete = true;
  release.retire();
  CHECK(late_freed.expired());
  CHECK(release.size() == 0);
}

TEST_CASE(
    "swap deferred release: a fence on no stream (complete from the start when real) is asked on "
    "its own and does not hold back the stream's") {
  Release release;
  TestFence::Queries asked;
  auto unordered = std::make_shared<TestFence>();
  at::Tensor source = torch::ones({2});
  const Watch unordered_freed = watch(source);
  release.until_complete(std::move(source), unordered);
  HeldOnStream copies(release, kConsumer, 3);
  copies.fences[0]->complete = true;
  asked = retire_counting(release);
  CHECK(asked.not_done == 2);  // the unordered fence and copies' second
  CHECK(asked.done == 1);
  CHECK_FALSE(unordered_freed.expired());
  CHECK(copies.freed_count() == 1);
  unordered->complete = true;
  release.retire();
  CHECK(unordered_freed.expired());
  CHECK(release.size() == 2);
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
