// The counts of recompose::CpuMemoryCounting (include/recompose/cpu_memory_counting.h), for the
// memory readers (engine/memory_in_use.h).
#pragma once

#include <cstdint>

namespace recompose::detail {

// Bytes of CPU storages allocated through the counting wrapper and not yet freed, and the most
// there were since reset_cpu_peak(). Both 0 before counting was ever on.
int64_t counted_cpu_current();
int64_t counted_cpu_peak();
// The peak starts again from the current count.
void reset_cpu_peak();

}  // namespace recompose::detail
