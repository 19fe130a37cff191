// record_memory_history and dump_memory_snapshot (include/recompose/memory_snapshot.h): the
// allocator's history recorded, and a sink of the events (events/events.h) that sets the
// allocator's user metadata to what recompose is doing (a region's forward, its replay or rerun,
// a copy of one of its saved tensors) and notes the allocations the regions hold for backward.
#include "ledger/memory_snapshot.h"

#include "engine/tensor_accounting.h"
#include "events/events.h"
#include "memory/cpu_memory_counter.h"

#include <recompose/checkpoint_error.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/memory_snapshot.h>

#include <torch/nn/module.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <fstream>
#include <mutex>
#include <utility>

namespace recompose::detail {
namespace {

// A region as the snapshot sink knows it: its label, and whether its rebuild tries a replay.
struct SnapshotRegion {
  std::string name;  // "#k <module type> (<mode>)"
  bool replays_first = false;
};

enum class Window : uint8_t { Forward, Rebuild, Copy };

// What this thread is doing, innermost last: the allocator's user metadata is the last one's.
struct OpenWindow {
  const void* region;
  Window window;
  std::string metadata;
};
thread_local std::vector<OpenWindow> t_windows;
thread_local uint64_t t_windows_recording = 0;  // the recording t_windows belongs to

const char* mode_of(events::RegionKind kind) {
  switch (kind) {
    case events::RegionKind::Full:
      return "full";
    case events::RegionKind::Selective:
      return "selective";
    case events::RegionKind::CustomContexts:
      return "custom contexts";
    case events::RegionKind::OffloadCall:
      return "offloaded call";
  }
  return "";
}

class SnapshotSink final : public events::Sink {
 public:
  SnapshotSink(c10::Device device, uint64_t recording) : device_(device), recording_(recording) {}

  std::shared_ptr<void> region_begun(const events::RegionBegun& event, void*) override {
    // A region begun in a rebuild is part of the rebuild's window.
    if (event.in_recomputation) return nullptr;
    auto region = std::make_shared<SnapshotRegion>();
    std::string type = event.module != nullptr ? event.module->name() : "checkpoint(fn)";
    {
      std::lock_guard lock(mutex_);
      region->name = "#" + std::to_string(++regions_) + " " + type;
    }
    region->replays_first = event.kind != events::RegionKind::Full;
    open(region.get(), Window::Forward,
         "forward: " + region->name + " (" + mode_of(event.kind) + ")");
    return region;
  }
  void forward_ended(void* region, const std::exception_ptr&) override {
    close_window(region, Window::Forward);
  }
  void rebuild_begun(void* region) override {
    const auto& r = *static_cast<SnapshotRegion*>(region);
    open(region, Window::Rebuild, (r.replays_first ? "replay: " : "rerun: ") + r.name);
  }
  void rebuild_reran(void* region) override {
    close_window(region, Window::Rebuild);
    open(region, Window::Rebuild, "rerun: " + static_cast<SnapshotRegion*>(region)->name);
  }
  void rebuild_ended(void* region, bool, int64_t, const std::exception_ptr&) override {
    close_window(region, Window::Rebuild);
  }
  void copy_begun(void* region, events::CopyDirection direction) override {
    const bool to_host = direction == events::CopyDirection::ToHost;
    open(region, Window::Copy,
         (to_host ? "pack: " : "reload: ") + static_cast<SnapshotRegion*>(region)->name);
  }
  void copy_launched(void* region, const events::CopyLaunched&) override {
    close_window(region, Window::Copy);
  }
  void inputs_saved(void* region, events::InputsSaved how,
                    const std::vector<at::Tensor>& inputs) override {
    if (how != events::InputsSaved::Held) return;
    for (const at::Tensor& t : inputs) {
      if (t.defined() && t.has_storage() && !is_parameter_like(t)) note_held(region, t);
    }
  }
  std::shared_ptr<void> bytes_charged(void* region, const at::Tensor& tensor, int64_t) override {
    if (tensor.defined() && tensor.has_storage()) note_held(region, tensor);
    return nullptr;
  }

  std::vector<HeldMark> held() const {
    std::lock_guard lock(mutex_);
    return held_;
  }

 private:
  void set_metadata(const std::string& metadata) const {
#ifdef RECOMPOSE_WITH_CUDA
    if (device_.is_cuda()) {
      c10::cuda::CUDACachingAllocator::setUserMetadata(metadata);
      return;
    }
#endif
    set_cpu_trace_metadata(metadata);
  }

  std::vector<OpenWindow>& windows() const {
    if (t_windows_recording != recording_) {  // left by an earlier recording
      t_windows.clear();
      t_windows_recording = recording_;
    }
    return t_windows;
  }

  void open(const void* region, Window window, std::string metadata) {
    auto& open_windows = windows();
    open_windows.push_back({region, window, std::move(metadata)});
    set_metadata(open_windows.back().metadata);
  }

  // Closes the innermost window of `region` of this kind and any left open inside it (a copy
  // whose launch threw).
  void close_window(const void* region, Window window) {
    auto& open_windows = windows();
    for (auto i = open_windows.size(); i-- > 0;) {
      if (open_windows[i].region != region || open_windows[i].window != window) continue;
      open_windows.resize(i);
      set_metadata(open_windows.empty() ? std::string() : open_windows.back().metadata);
      return;
    }
  }

  // CPU: the allocation of `tensor`'s storage is held for backward by `region` (the trace's
  // addresses are the storages' data pointers). The CUDA allocator's snapshot is written as it is.
  void note_held(void* region, const at::Tensor& tensor) {
    if (!device_.is_cpu() || !tensor.device().is_cpu()) return;
    const auto addr = reinterpret_cast<uint64_t>(tensor.storage().data());
    const uint64_t sequence = cpu_trace_sequence();
    std::lock_guard lock(mutex_);
    held_.push_back({sequence, addr, static_cast<SnapshotRegion*>(region)->name});
  }

  const c10::Device device_;
  const uint64_t recording_;
  mutable std::mutex mutex_;
  int64_t regions_ = 0;
  std::vector<HeldMark> held_;
};

// The process's recording: on, or the last one stopped.
struct Recording {
  std::mutex mutex;
  std::shared_ptr<SnapshotSink> sink;  // null before the first recording
  c10::Device device{c10::kCPU};
  bool on = false;
  uint64_t number = 0;
};

Recording& recording() {
  static auto* state = new Recording;  // never destroyed: sinks may outlive main()'s statics
  return *state;
}

void start_allocator_history(const MemoryHistoryOptions& options) {
  if (options.max_entries() <= 0) {
    throw CheckpointError("recompose: record_memory_history: max_entries must be positive, not " +
                          std::to_string(options.max_entries()));
  }
  const c10::Device device = options.device();
  if (device.is_cpu()) {
    if (!cpu_memory_counting()) {
      throw CheckpointError(
          "recompose: record_memory_history: CPU memory is recorded by the counting allocator, "
          "and no recompose::CpuMemoryCounting is alive: make one (at the start of main, before "
          "the model) before recording");
    }
    start_cpu_trace(options.max_entries());
    return;
  }
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    // No stacks (no Python here; C++ stacks cost an unwind per allocation): the entries alone.
    torch::cuda::_record_memory_history(/*enabled=*/true, /*record_context=*/false,
                                        options.max_entries(),
                                        /*trace_alloc_record_context=*/false);
    return;
  }
#endif
  throw CheckpointError("recompose: record_memory_history: cannot record the memory of " +
                        device.str() +
                        ": recompose records CPU memory (with CpuMemoryCounting) and CUDA "
                        "memory (in a build with CUDA)");
}

void stop_allocator_history(const c10::Device& device, bool clear) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::setUserMetadata("");
    torch::cuda::_record_memory_history(/*enabled=*/false, /*record_context=*/true,
                                        /*trace_alloc_max_entries=*/1,
                                        /*trace_alloc_record_context=*/false,
                                        /*record_cpp_context=*/false, /*clearHistory=*/clear);
    return;
  }
#endif
  (void)device;
  set_cpu_trace_metadata("");
  stop_cpu_trace(clear);
}

// The snapshot's pickle bytes; `caller` names the function in the error.
std::string snapshot_bytes(const char* caller) {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  if (!r.sink) {
    throw CheckpointError(std::string("recompose: ") + caller +
                          ": no memory history was recorded in this process: call "
                          "recompose::record_memory_history(true) before the step, then dump");
  }
#ifdef RECOMPOSE_WITH_CUDA
  if (r.device.is_cuda()) return torch::cuda::_memory_snapshot_pickled();
#endif
  return cpu_snapshot_pickle(cpu_trace(), r.sink->held());
}

}  // namespace
}  // namespace recompose::detail

namespace recompose {

void record_memory_history(bool enabled, const MemoryHistoryOptions& options) {
  detail::Recording& r = detail::recording();
  std::lock_guard lock(r.mutex);
  if (!enabled) {
    if (r.on) {
      r.on = false;
      r.sink->close();
      detail::stop_allocator_history(r.device, options.clear_history());
    } else if (options.clear_history() && r.sink) {
      detail::stop_allocator_history(r.device, /*clear=*/true);
    }
    if (options.clear_history()) r.sink.reset();
    return;
  }
  if (r.on) {
    throw CheckpointError(
        "recompose: record_memory_history: a recording is on already (one in the process at a "
        "time): stop it with record_memory_history(false) first");
  }
  detail::start_allocator_history(options);
  r.device = options.device();
  r.sink = std::make_shared<detail::SnapshotSink>(r.device, ++r.number);
  r.sink->listen();
  r.on = true;
}

bool recording_memory_history() {
  detail::Recording& r = detail::recording();
  std::lock_guard lock(r.mutex);
  return r.on;
}

std::string memory_snapshot() { return detail::snapshot_bytes("memory_snapshot"); }

void dump_memory_snapshot(const std::string& path) {
  const std::string bytes = detail::snapshot_bytes("dump_memory_snapshot");
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) {
    throw CheckpointError("recompose: dump_memory_snapshot: cannot write " + path +
                          " (does its folder exist, and may it be written?)");
  }
}

}  // namespace recompose
