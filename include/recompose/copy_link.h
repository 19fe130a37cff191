// The device <-> host link that offload copies cross: a bandwidth each way and a fixed cost per
// copy. The never-stall offload (OffloadOptions::never_stall) and the planner's copy-window model
// (SolveOptions::link) decide with it whether a copy fits in the compute that hides it.
//
//   recompose::LinkModel link = recompose::measure_link(torch::Device("cuda:0"));  // on a GPU
//   recompose::LinkModel h100{.d2h_bytes_per_second = 53e9, .h2d_bytes_per_second = 35e9,
//                             .seconds_per_copy = 10e-6};                           // given
//   link.d2h_seconds(64 << 20);   // one 64 MiB copy to host memory
//
// The two directions differ on real links (an H100 over PCIe: ~53 GB/s to the host, ~35 GB/s
// back in published nvbandwidth runs), and each copy has a launch and synchronisation cost that
// many small tensors pay many times.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace recompose {

/// The device <-> host link: a bandwidth each way and a fixed cost per copy. An aggregate: give
/// its fields, use symmetric(), or measure it with measure_link(). Every field defaults to 0,
/// which is not valid() (never_stall and the planner need positive bandwidths).
///
/// Example:
/// ```
/// recompose::LinkModel h100{.d2h_bytes_per_second = 53e9, .h2d_bytes_per_second = 35e9,
///                           .seconds_per_copy = 10e-6};
/// double t = h100.d2h_seconds(int64_t{64} << 20);   // one 64 MiB copy to host memory
/// auto pcie4 = recompose::LinkModel::symmetric(25e9);
/// ```
struct LinkModel {
  double d2h_bytes_per_second = 0;  ///< device -> host, bytes per second. Default: 0
  double h2d_bytes_per_second = 0;  ///< host -> device, bytes per second. Default: 0
  double seconds_per_copy = 0;      ///< fixed cost of one copy, either way. Default: 0

  /// The same bandwidth both ways: {bytes_per_second, bytes_per_second, seconds_per_copy}.
  static LinkModel symmetric(double bytes_per_second, double seconds_per_copy = 0) {
    return {bytes_per_second, bytes_per_second, seconds_per_copy};
  }
  /// Both bandwidths positive and finite, the fixed cost non-negative.
  bool valid() const {
    return d2h_bytes_per_second > 0 && h2d_bytes_per_second > 0 && seconds_per_copy >= 0 &&
           d2h_bytes_per_second < 1e300 && h2d_bytes_per_second < 1e300;
  }
  /// Seconds to move `bytes` in `copies` copies, device to host: bytes / d2h_bytes_per_second +
  /// copies * seconds_per_copy.
  double d2h_seconds(int64_t bytes, int64_t copies = 1) const {
    return static_cast<double>(bytes) / d2h_bytes_per_second +
           static_cast<double>(copies) * seconds_per_copy;
  }
  /// The same, host to device.
  double h2d_seconds(int64_t bytes, int64_t copies = 1) const {
    return static_cast<double>(bytes) / h2d_bytes_per_second +
           static_cast<double>(copies) * seconds_per_copy;
  }
};

/// Measures the link of `device` (a CUDA device): each direction's bandwidth from 64 MiB copies
/// between the device and pinned host memory, the fixed cost from 4 KiB copies; best of five runs
/// each. Takes a few tens of milliseconds. Throws CheckpointError if `device` is not a CUDA
/// device, or if this LibTorch has no CUDA or sees no such device.
///
/// Example:
/// ```
/// recompose::LinkModel link = recompose::measure_link(torch::Device("cuda:0"));
/// std::printf("%.1f GB/s to host\n", link.d2h_bytes_per_second / 1e9);
/// ```
LinkModel measure_link(const c10::Device& device);

}  // namespace recompose
