// CpuMemoryCounting: CPU tensor memory counted, so that peaks, peak budgets and the step ledger's
// memory timeline work on CPU as the CUDA caching allocator's statistics make them work on a GPU.
//
//   recompose::CpuMemoryCounting counting;          // at the start of main, before the model
//   recompose::reset_peak_device_memory(torch::kCPU);
//   train_step();
//   int64_t peak = recompose::peak_device_memory(torch::kCPU);  // -1 without counting
//
// What it does: while a CpuMemoryCounting is alive, c10's CPU allocator (c10::GetCPUAllocator,
// which every CPU tensor's storage comes from) is a thin wrapper around the allocator that was
// installed before it: each allocation goes to that allocator and its size is added to a current
// and a peak count; its free subtracts it. The readers of recompose/device_memory.h
// (current_device_memory, peak_device_memory, reset_peak_device_memory) report these counts for
// a CPU device while counting is on, and -1 ("not measured") when it is off, as for any device they
// cannot measure. Memory allocated while counting is off is never counted; memory allocated while
// it was on is subtracted when freed, whenever that is.
//
// Cost: per CPU allocation and free, a mutex-guarded hash-map insert or erase and two atomic
// updates (a few hundred nanoseconds); nothing when off. Results are bitwise the same: the
// memory comes from the same allocator, only counted.
//
// Nesting and restoring: scopes nest (a count); the first installs the wrapper, the last one
// destroyed installs the allocator that was current before the first again (with c10's
// allocator priority 1, which stays: an allocator set later with priority 0 does not replace
// it). The wrapper itself is never freed: storages allocated through it may outlive the scope,
// and their deleter is the wrapper's.
//
// Thread-safety: the counts are safe to read and update from any thread. Installing and
// restoring replace c10's allocator pointer, which c10 does not synchronise: make and destroy
// the scope while no other thread allocates CPU tensors (at the start and end of main, or between
// steps with no DataLoader workers running).
//
// Errors: throws CheckpointError if another CPU allocator was set with a priority above 1 (the
// wrapper would not be used), or if the current allocator cannot be wrapped (its allocations
// do not carry the data pointer as their context, as c10's default CPU allocator's do).
// Allocations of another shape are passed through uncounted.
//
// The planner's profiler (profile_memory) does not read it: on CPU the counted peak of the profiled
// step would include the profiler's own copy of the model, kept in host memory; a CPU profile's
// resident bytes are the model's parameters, gradients and buffers, counting on or off.
#pragma once

#include <cstdint>

namespace recompose {

/// While alive, CPU tensor memory is counted (see the header comment: cost, nesting, threads).
///
/// Example:
/// ```
/// int main() {
///   recompose::CpuMemoryCounting counting;   // before the model is made
///   ...
///   recompose::reset_peak_device_memory(torch::kCPU);
///   train_step();
///   std::cout << recompose::peak_device_memory(torch::kCPU) << " bytes at the peak\n";
/// }
/// ```
class CpuMemoryCounting {
 public:
  /// Starts counting (the first scope alive installs the counting wrapper). Throws
  /// CheckpointError if another CPU allocator was set with a priority above 1, or if the current
  /// allocator cannot be wrapped (it has no raw deleter).
  CpuMemoryCounting();
  /// Stops counting when it is the last scope alive (the allocator from before is installed again).
  ~CpuMemoryCounting();
  CpuMemoryCounting(const CpuMemoryCounting&) = delete;
  CpuMemoryCounting& operator=(const CpuMemoryCounting&) = delete;
};

/// Whether a CpuMemoryCounting is alive (CPU memory is counted).
///
/// Example:
/// ```
/// if (!recompose::cpu_memory_counting()) std::puts("CPU peaks read -1: not counted");
/// ```
bool cpu_memory_counting();

}  // namespace recompose
