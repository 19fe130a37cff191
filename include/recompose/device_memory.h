// Device memory as the planner measures it: the CUDA caching allocator's statistics, which a
// peak budget (Budget::peak_bytes) is planned against and checked with; on CPU, the counts of
// recompose/cpu_memory_counting.h while a CpuMemoryCounting is alive.
//
//   recompose::reset_peak_device_memory(device);
//   train_step();
//   int64_t peak = recompose::peak_device_memory(device);  // compare with the plan's budget
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace recompose {

/// Starts a new peak measurement on `device`: resets the CUDA caching allocator's peak statistics,
/// or, on CPU while a CpuMemoryCounting is alive, the counted peak. Does nothing on a device
/// recompose cannot measure (CPU without counting, or a build without CUDA).
///
/// Example:
/// ```
/// recompose::reset_peak_device_memory(torch::Device("cuda:0"));
/// ```
void reset_peak_device_memory(const c10::Device& device);

/// Peak bytes allocated on `device` since the last reset, by every stream, as the CUDA caching
/// allocator counts them (torch.cuda.max_memory_allocated); on CPU, the counted peak while a
/// CpuMemoryCounting is alive. -1 on a device recompose cannot measure (CPU without counting, or a
/// build without CUDA). Does not throw.
///
/// Example:
/// ```
/// recompose::reset_peak_device_memory(device);
/// train_step();
/// int64_t peak = recompose::peak_device_memory(device);   // compare with the plan's budget
/// ```
int64_t peak_device_memory(const c10::Device& device);

/// Peak bytes the CUDA caching allocator reserved from `device` since the last reset (allocated,
/// cached and fragmented blocks: torch.cuda.max_memory_reserved), what a memory cap limits. -1 on
/// any other device (CPU has no cache, counted or not) or in a build without CUDA. Does not throw.
///
/// Example:
/// ```
/// int64_t reserved = recompose::peak_reserved_device_memory(torch::Device("cuda:0"));
/// ```
int64_t peak_reserved_device_memory(const c10::Device& device);

/// Bytes allocated on `device` now (torch.cuda.memory_allocated; on CPU, the counted bytes while a
/// CpuMemoryCounting is alive); -1 where not measured. Does not throw.
///
/// Example:
/// ```
/// int64_t before = recompose::current_device_memory(device);
/// ```
int64_t current_device_memory(const c10::Device& device);

/// cudaMalloc calls the caching allocator on `device` retried after freeing its cache, since the
/// process started (torch.cuda.memory_stats()["num_alloc_retries"]): each synchronises the device,
/// and a step near a memory cap shows them. -1 where not measured (any device but CUDA). Does not
/// throw.
///
/// Example:
/// ```
/// int64_t before = recompose::device_allocation_retries(device);
/// train_step();
/// if (recompose::device_allocation_retries(device) > before) std::puts("near the memory cap");
/// ```
int64_t device_allocation_retries(const c10::Device& device);

}  // namespace recompose
