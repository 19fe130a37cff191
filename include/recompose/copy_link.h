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

struct LinkModel {
  double d2h_bytes_per_second = 0;  // device -> host
  double h2d_bytes_per_second = 0;  // host -> device
  double seconds_per_copy = 0;      // fixed cost of one copy, either way

  // The same bandwidth both ways.
  static LinkModel symmetric(double bytes_per_second, double seconds_per_copy = 0) {
    return {bytes_per_second, bytes_per_second, seconds_per_copy};
  }
  // Both bandwidths positive and finite, the fixed cost non-negative.
  bool valid() const {
    return d2h_bytes_per_second > 0 && h2d_bytes_per_second > 0 && seconds_per_copy >= 0 &&
           d2h_bytes_per_second < 1e300 && h2d_bytes_per_second < 1e300;
  }
  // Seconds to move `bytes` in `copies` copies, one way.
  double d2h_seconds(int64_t bytes, int64_t copies = 1) const {
    return static_cast<double>(bytes) / d2h_bytes_per_second +
           static_cast<double>(copies) * seconds_per_copy;
  }
  double h2d_seconds(int64_t bytes, int64_t copies = 1) const {
    return static_cast<double>(bytes) / h2d_bytes_per_second +
           static_cast<double>(copies) * seconds_per_copy;
  }
};

// Measures the link of `device` (a CUDA device): each direction's bandwidth from 64 MiB copies
// between the device and pinned host memory, the fixed cost from 4 KiB copies; best of five runs
// each. Takes a few tens of milliseconds. Throws CheckpointError if `device` is not a CUDA
// device, or if this LibTorch has no CUDA or sees no device.
LinkModel measure_link(const c10::Device& device);

}  // namespace recompose
