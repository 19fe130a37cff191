// The counting allocator's trace as the snapshot pytorch.org/memory_viz reads: the dict that
// torch::cuda::_memory_snapshot_pickled writes for a CUDA device (torch/csrc/cuda/
// memory_snapshot.cpp), for one device, pickled by LibTorch's pickler without type tags (plain
// Python dicts, lists and tuples: Python's pickle loads it without torch).
#include "ledger/memory_snapshot.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

namespace recompose::detail {
namespace {

using c10::IValue;
using SnapshotDict = c10::Dict<IValue, IValue>;
using SnapshotList = c10::List<IValue>;

SnapshotDict snapshot_dict() { return SnapshotDict(c10::AnyType::get(), c10::AnyType::get()); }
SnapshotList snapshot_list() { return SnapshotList(c10::AnyType::get()); }

constexpr const char* kHeldCategory = "held for backward";

// What memory_viz shows for one allocation or free: its user metadata and category.
struct EntryLabel {
  std::string metadata;
  std::string category;
};

// The category of `metadata` ("forward: #1 ..." -> "forward"); "unknown" (memory_viz's word for
// an entry without one) when there is none.
std::string category_of(const std::string& metadata) {
  const auto colon = metadata.find(": ");
  return colon == std::string::npos ? "unknown" : metadata.substr(0, colon);
}

// The labels of the entries, with the allocations the marks hold (each once, the first region
// that holds it) relabelled: the marks are matched to the allocation live at their address when
// they were taken.
std::vector<EntryLabel> entry_labels(const CpuTrace& trace, std::vector<HeldMark> held) {
  std::stable_sort(held.begin(), held.end(),
                   [](const HeldMark& a, const HeldMark& b) { return a.sequence < b.sequence; });
  std::vector<EntryLabel> labels;
  labels.reserve(trace.entries.size());
  std::unordered_map<uint64_t, std::size_t> live;  // address -> index of its alloc entry
  auto mark = held.begin();
  auto apply_marks = [&](uint64_t before) {
    for (; mark != held.end() && mark->sequence <= before; ++mark) {
      auto it = live.find(mark->addr);
      if (it == live.end()) continue;  // allocated before the trace (or dropped from it)
      EntryLabel& label = labels[it->second];
      if (label.category == kHeldCategory) continue;
      label.metadata += (label.metadata.empty() ? "" : "; ") +
                        std::string("held for backward by ") + mark->region;
      label.category = kHeldCategory;
    }
  };
  for (const CpuTraceEntry& e : trace.entries) {
    apply_marks(e.sequence);
    const std::string metadata = e.metadata ? *e.metadata : std::string();
    labels.push_back({metadata, category_of(metadata)});
    if (e.alloc) {
      live[e.addr] = labels.size() - 1;
    } else {
      live.erase(e.addr);
    }
  }
  apply_marks(UINT64_MAX);
  return labels;
}

SnapshotDict trace_entry(const char* action, uint64_t addr, int64_t size, int64_t time_us,
                         const EntryLabel& label) {
  SnapshotDict entry = snapshot_dict();
  entry.insert("action", action);
  entry.insert("addr", static_cast<int64_t>(addr));
  entry.insert("size", size);
  entry.insert("stream", int64_t{0});
  entry.insert("time_us", time_us);
  entry.insert("frames", snapshot_list());
  entry.insert("compile_context", "");
  entry.insert("user_metadata", label.metadata);
  entry.insert("category", label.category);
  return entry;
}

// The trace as the caching allocator writes its own: an allocation is a segment (the memory the
// CPU allocator took from the system) and a block in it; a free the block's free requested and
// completed, then the segment's. The last entry, a "snapshot" as the allocator adds when its
// snapshot is taken, carries the category "unknown", which memory_viz expects among the
// categories once there are any.
SnapshotList device_trace(const CpuTrace& trace, const std::vector<HeldMark>& held) {
  const std::vector<EntryLabel> labels = entry_labels(trace, held);
  SnapshotList list = snapshot_list();
  for (std::size_t i = 0; i < trace.entries.size(); ++i) {
    const CpuTraceEntry& e = trace.entries[i];
    const EntryLabel& label = labels[i];
    if (e.alloc) {
      list.push_back(trace_entry("segment_alloc", e.addr, e.bytes, e.time_us, label));
      list.push_back(trace_entry("alloc", e.addr, e.bytes, e.time_us, label));
    } else {
      list.push_back(trace_entry("free_requested", e.addr, e.bytes, e.time_us, label));
      list.push_back(trace_entry("free_completed", e.addr, e.bytes, e.time_us, label));
      list.push_back(trace_entry("segment_free", e.addr, e.bytes, e.time_us, label));
    }
  }
  const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  list.push_back(trace_entry("snapshot", 0, 0, now, {"", "unknown"}));
  return list;
}

// The allocations alive now, each a segment holding one allocated block.
SnapshotList segments(const CpuTrace& trace) {
  auto live = trace.live;
  std::sort(live.begin(), live.end());
  SnapshotList list = snapshot_list();
  for (const auto& [addr, bytes] : live) {
    SnapshotDict block = snapshot_dict();
    block.insert("address", static_cast<int64_t>(addr));
    block.insert("size", bytes);
    block.insert("requested_size", bytes);
    block.insert("state", "active_allocated");
    block.insert("frames", snapshot_list());
    SnapshotList blocks = snapshot_list();
    blocks.push_back(block);
    SnapshotDict segment = snapshot_dict();
    segment.insert("device", int64_t{0});
    segment.insert("address", static_cast<int64_t>(addr));
    segment.insert("total_size", bytes);
    segment.insert("allocated_size", bytes);
    segment.insert("active_size", bytes);
    segment.insert("requested_size", bytes);
    segment.insert("stream", int64_t{0});
    segment.insert("segment_type", "large");
    segment.insert("segment_pool_id", c10::ivalue::Tuple::create({int64_t{0}, int64_t{0}}));
    segment.insert("is_expandable", false);
    segment.insert("frames", snapshot_list());
    segment.insert("blocks", blocks);
    list.push_back(segment);
  }
  return list;
}

SnapshotDict allocator_settings(const CpuTrace& trace) {
  SnapshotDict settings = snapshot_dict();
  settings.insert("allocator", "recompose CPU counting allocator");
  settings.insert("trace_alloc_max_entries", trace.max_entries);
  settings.insert("trace_alloc_overflowed", trace.overflowed);
  return settings;
}

}  // namespace

std::string cpu_snapshot_pickle(const CpuTrace& trace, const std::vector<HeldMark>& held) {
  SnapshotList traces = snapshot_list();
  traces.push_back(device_trace(trace, held));
  SnapshotDict snapshot = snapshot_dict();
  snapshot.insert("segments", segments(trace));
  snapshot.insert("device_traces", traces);
  snapshot.insert("allocator_settings", allocator_settings(trace));
  snapshot.insert("external_annotations", snapshot_list());
  std::string bytes;
  // As memory_snapshot.cpp pickles: no type tags on dicts and lists (tag_aggregates false), so
  // that unpickling needs no torch module.
  torch::jit::Pickler pickler([&](const char* data, size_t size) { bytes.append(data, size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(snapshot);
  pickler.stop();
  return bytes;
}

}  // namespace recompose::detail
