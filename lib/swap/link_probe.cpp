// measure_link(): the device <-> host link, each direction apart, and the fixed cost per copy
// (recompose/copy_link.h). Device-generic LibTorch only: it compiles in a CPU-only build and
// refuses, at run time, a device it cannot measure.
#include <recompose/checkpoint_error.h>
#include <recompose/copy_link.h>

#include <torch/cuda.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

namespace recompose {
namespace {

using Clock = std::chrono::steady_clock;

// Best of `runs` timings of `copies` copies queued back to back, then one synchronisation.
template <class Copy>
double best_seconds(int runs, int copies, Copy copy) {
  double best = INFINITY;
  for (int r = 0; r < runs; ++r) {
    torch::cuda::synchronize();
    const auto t0 = Clock::now();
    for (int c = 0; c < copies; ++c) copy();
    torch::cuda::synchronize();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

LinkModel measure_link(const c10::Device& device) {
  if (!device.is_cuda()) {
    throw CheckpointError(
        "measure_link: " + device.str() +
        " is not a CUDA device (offloading from the CPU copies nothing across a link)");
  }
  if (!torch::cuda::is_available() ||
      (device.has_index() && device.index() >= torch::cuda::device_count())) {
    throw CheckpointError("measure_link: no " + device.str() +
                          " here (a CPU-only LibTorch, or no such GPU at run time)");
  }
  constexpr int64_t kLarge = int64_t{64} << 20, kSmall = 4096;
  constexpr int kSmallCopies = 64;
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8);
  auto device_large = torch::empty({kLarge}, bytes.device(device));
  auto host_large = torch::empty({kLarge}, bytes.pinned_memory(true));
  auto device_small = torch::empty({kSmall}, bytes.device(device));
  auto host_small = torch::empty({kSmall}, bytes.pinned_memory(true));
  host_large.copy_(device_large);  // warm-up: first touches, the copy engines' setup
  device_large.copy_(host_large);

  // Small copies queued back to back: what each costs beyond its bytes (launch, DMA setup).
  const double small_out =
      best_seconds(5, kSmallCopies, [&] { host_small.copy_(device_small, true); }) / kSmallCopies;
  const double small_in =
      best_seconds(5, kSmallCopies, [&] { device_small.copy_(host_small, true); }) / kSmallCopies;
  const double large_out = best_seconds(5, 1, [&] { host_large.copy_(device_large, true); });
  const double large_in = best_seconds(5, 1, [&] { device_large.copy_(host_large, true); });

  LinkModel link;
  link.seconds_per_copy = std::max(0.0, std::min(small_out, small_in));
  // The large copy pays the fixed cost once (and the final synchronisation): take it out.
  link.d2h_bytes_per_second =
      static_cast<double>(kLarge) / std::max(large_out - link.seconds_per_copy, 1e-9);
  link.h2d_bytes_per_second =
      static_cast<double>(kLarge) / std::max(large_in - link.seconds_per_copy, 1e-9);
  return link;
}

}  // namespace recompose
