// Memory in use on a device, as recompose measures it: the CUDA caching allocator's statistics on
// a CUDA device, the counting wrapper's counts (recompose::CpuMemoryCounting) on CPU while it is
// on, nothing otherwise. The one place of the library that reads them: recompose/device_memory.h
// and the step ledger's timeline both read through here.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace recompose::detail {

struct MemoryReading {
  int64_t current = -1;  // bytes allocated now; -1 where not measured
  int64_t peak = -1;     // the most since the last reset_memory_peak; -1 where not measured
  // What the CUDA caching allocator holds from the device (allocated, cached and fragmented), now
  // and its most since the last reset_memory_peak; -1 elsewhere (CPU has no cache).
  int64_t reserved = -1;
  int64_t reserved_peak = -1;
};

// Not measured (CPU without counting, a build without CUDA, another device type): -1s. Does not
// throw.
MemoryReading read_memory(const c10::Device& device);
// Starts a new peak on `device` (the current count becomes the peak); nothing where not measured.
void reset_memory_peak(const c10::Device& device);
// What measures `device`: "CUDA caching allocator", "CPU counting allocator", or "" (not measured).
const char* memory_source(const c10::Device& device);
// cudaMalloc calls retried after freeing the cache on a CUDA device since the process started;
// -1 elsewhere.
int64_t memory_allocation_retries(const c10::Device& device);
// Gives the CUDA caching allocator's unused cached blocks back to the device (a measurement of
// what one configuration reserves then starts from its own blocks); nothing elsewhere.
void release_cached_memory(const c10::Device& device);

}  // namespace recompose::detail
