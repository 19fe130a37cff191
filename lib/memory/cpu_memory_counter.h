// The counts of recompose::CpuMemoryCounting (include/recompose/cpu_memory_counting.h), for the
// memory readers (memory/memory_in_use.h), and its trace of allocations and frees, for the
// memory_viz snapshot (ledger/memory_snapshot.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace recompose::detail {

// Bytes of CPU storages allocated through the counting wrapper and not yet freed, and the most
// there were since reset_cpu_peak(). Both 0 before counting was ever on.
int64_t counted_cpu_current();
int64_t counted_cpu_peak();
// The peak starts again from the current count.
void reset_cpu_peak();

// ---- The trace (Note [ CPU allocation trace ]) ----

// Note [ CPU allocation trace ]
// While a trace records, the counting wrapper appends an entry per counted allocation and per
// free of one, as the CUDA caching allocator's history does for a GPU: its address, bytes, time
// and the trace's user metadata at that moment (set_cpu_trace_metadata, the CUDA allocator's
// setUserMetadata). Off, each allocation and free pays one relaxed atomic load more.

struct CpuTraceEntry {
  bool alloc = true;  // else a free
  uint64_t addr = 0;
  int64_t bytes = 0;
  int64_t time_us = 0;    // system clock, since the epoch (the CUDA snapshot's time_us)
  uint64_t sequence = 0;  // its number since the trace started (0 first)
  std::shared_ptr<const std::string> metadata;  // null: none was set
};

struct CpuTrace {
  std::deque<CpuTraceEntry> entries;  // oldest first; the newest max_entries
  bool overflowed = false;            // older entries were dropped
  int64_t max_entries = 0;
  std::vector<std::pair<uint64_t, int64_t>> live;  // counted allocations alive now (addr, bytes)
};

// Starts a new trace (a previous one is dropped), keeping at most `max_entries` (> 0).
void start_cpu_trace(int64_t max_entries);
// Stops recording; `clear` drops the entries too.
void stop_cpu_trace(bool clear);
// The user metadata of the entries recorded from now on ("" for none).
void set_cpu_trace_metadata(const std::string& metadata);
// The number the next entry will get (entries recorded so far since the trace started).
uint64_t cpu_trace_sequence();
// A copy of the trace so far (empty if none was started) and the live allocations.
CpuTrace cpu_trace();

}  // namespace recompose::detail
