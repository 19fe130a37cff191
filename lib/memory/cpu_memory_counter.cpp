// recompose::CpuMemoryCounting: a counting wrapper around c10's CPU allocator.
#include "memory/cpu_memory_counter.h"

#include <recompose/checkpoint_error.h>
#include <recompose/cpu_memory_counting.h>

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

namespace recompose {
namespace detail {
namespace {

// Whether the trace records: the allocation and free paths' one check (constant-initialised, so
// reading it needs no guard of a function-local static).
constinit std::atomic<bool> g_cpu_trace_on{false};

// The trace of Note [ CPU allocation trace ]: never destroyed (frees may come after main()).
class CpuTraceRecorder {
 public:
  void record(bool alloc, void* data, size_t bytes) {
    const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    std::lock_guard lock(mutex_);
    if (!g_cpu_trace_on.load(std::memory_order_relaxed)) return;  // stopped meanwhile
    if (static_cast<int64_t>(trace_.entries.size()) == trace_.max_entries) {
      trace_.entries.pop_front();
      trace_.overflowed = true;
    }
    trace_.entries.push_back({alloc, reinterpret_cast<uint64_t>(data), static_cast<int64_t>(bytes),
                              now, sequence_++, metadata_});
  }

  void start(int64_t max_entries) {
    std::lock_guard lock(mutex_);
    trace_ = CpuTrace{};
    trace_.max_entries = max_entries;
    sequence_ = 0;
    metadata_.reset();
    g_cpu_trace_on.store(true, std::memory_order_relaxed);
  }
  void stop(bool clear) {
    std::lock_guard lock(mutex_);
    g_cpu_trace_on.store(false, std::memory_order_relaxed);
    if (clear) trace_ = CpuTrace{};
  }
  void set_metadata(const std::string& metadata) {
    auto shared = metadata.empty() ? nullptr : std::make_shared<const std::string>(metadata);
    std::lock_guard lock(mutex_);
    metadata_ = std::move(shared);
  }
  uint64_t sequence() {
    std::lock_guard lock(mutex_);
    return sequence_;
  }
  CpuTrace copy() {
    std::lock_guard lock(mutex_);
    return trace_;
  }

  static CpuTraceRecorder& instance() {
    static auto* recorder = new CpuTraceRecorder;
    return *recorder;
  }

 private:
  std::mutex mutex_;
  CpuTrace trace_;
  uint64_t sequence_ = 0;
  std::shared_ptr<const std::string> metadata_;
};

// Delegates to the allocator it wraps. The data pointer doubles as the context (as in c10's
// default CPU allocator), so raw_allocate keeps working; the size is looked up at free.
class CountingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* inner = inner_.load(std::memory_order_acquire);
    c10::DataPtr ptr = inner->allocate(n);
    void* data = ptr.get();
    if (data == nullptr || ptr.get_context() != data || ptr.get_deleter() != inner->raw_deleter())
      return ptr;           // not the shape we wrap: passed through uncounted
    ptr.release_context();  // ownership moves to the DataPtr returned below
    {
      std::lock_guard lock(mutex_);
      sizes_[data] = Entry{n, inner->raw_deleter()};
    }
    const auto bytes = static_cast<int64_t>(n);
    const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    if (g_cpu_trace_on.load(std::memory_order_relaxed))
      CpuTraceRecorder::instance().record(/*alloc=*/true, data, n);
    return {data, data, &CountingCPUAllocator::free, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCPUAllocator::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // The wrapped allocator; a later install may wrap another one (the frees of the storages of
  // the first keep their own deleter, kept per allocation).
  void wrap(c10::Allocator* inner) { inner_.store(inner, std::memory_order_release); }
  c10::Allocator* wrapped() const { return inner_.load(std::memory_order_acquire); }

  int64_t current() const { return current_.load(std::memory_order_relaxed); }
  std::vector<std::pair<uint64_t, int64_t>> live() {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<uint64_t, int64_t>> out;
    out.reserve(sizes_.size());
    for (const auto& [data, entry] : sizes_)
      out.emplace_back(reinterpret_cast<uint64_t>(data), static_cast<int64_t>(entry.bytes));
    return out;
  }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

  static CountingCPUAllocator& instance() {
    static auto* counter = new CountingCPUAllocator;  // never destroyed: storages outlive main()
    return *counter;
  }

 private:
  struct Entry {
    size_t bytes;
    c10::DeleterFnPtr deleter;
  };

  static void free(void* data) {
    CountingCPUAllocator& self = instance();
    Entry entry{0, nullptr};
    {
      std::lock_guard lock(self.mutex_);
      auto it = self.sizes_.find(data);
      if (it != self.sizes_.end()) {
        entry = it->second;
        self.sizes_.erase(it);
      }
    }
    self.current_.fetch_sub(static_cast<int64_t>(entry.bytes), std::memory_order_relaxed);
    if (entry.deleter == nullptr) return;
    // Recorded before the memory goes back: an allocation reusing the address comes after it.
    if (g_cpu_trace_on.load(std::memory_order_relaxed))
      CpuTraceRecorder::instance().record(/*alloc=*/false, data, entry.bytes);
    entry.deleter(data);
  }

  std::atomic<c10::Allocator*> inner_{nullptr};
  std::mutex mutex_;
  std::unordered_map<void*, Entry> sizes_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

std::mutex g_scopes_mutex;
int g_scopes = 0;                     // alive CpuMemoryCounting scopes, under g_scopes_mutex
std::atomic<bool> g_counting{false};  // g_scopes != 0

}  // namespace

int64_t counted_cpu_current() { return CountingCPUAllocator::instance().current(); }
int64_t counted_cpu_peak() { return CountingCPUAllocator::instance().peak(); }
void reset_cpu_peak() { CountingCPUAllocator::instance().reset_peak(); }

void start_cpu_trace(int64_t max_entries) { CpuTraceRecorder::instance().start(max_entries); }
void stop_cpu_trace(bool clear) { CpuTraceRecorder::instance().stop(clear); }
void set_cpu_trace_metadata(const std::string& metadata) {
  CpuTraceRecorder::instance().set_metadata(metadata);
}
uint64_t cpu_trace_sequence() { return CpuTraceRecorder::instance().sequence(); }
CpuTrace cpu_trace() {
  CpuTrace trace = CpuTraceRecorder::instance().copy();
  trace.live = CountingCPUAllocator::instance().live();
  return trace;
}

}  // namespace detail

CpuMemoryCounting::CpuMemoryCounting() {
  using detail::CountingCPUAllocator;
  std::lock_guard lock(detail::g_scopes_mutex);
  if (detail::g_scopes == 0) {
    CountingCPUAllocator& counter = CountingCPUAllocator::instance();
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current == &counter) {
      // Left installed by a scope whose restore was overridden: count through it again.
    } else {
      if (current->raw_deleter() == nullptr) {
        throw CheckpointError(
            "recompose: CpuMemoryCounting: the CPU allocator installed has no raw deleter; it "
            "cannot be wrapped for counting");
      }
      counter.wrap(current);
      c10::SetCPUAllocator(&counter, /*priority=*/1);
      if (c10::GetCPUAllocator() != &counter) {
        throw CheckpointError(
            "recompose: CpuMemoryCounting: another CPU allocator was set with a priority above 1; "
            "the counting wrapper cannot replace it");
      }
    }
    detail::g_counting.store(true, std::memory_order_release);
  }
  ++detail::g_scopes;
}

CpuMemoryCounting::~CpuMemoryCounting() {
  using detail::CountingCPUAllocator;
  std::lock_guard lock(detail::g_scopes_mutex);
  if (--detail::g_scopes != 0) return;
  detail::g_counting.store(false, std::memory_order_release);
  CountingCPUAllocator& counter = CountingCPUAllocator::instance();
  if (c10::GetCPUAllocator() == &counter) c10::SetCPUAllocator(counter.wrapped(), /*priority=*/1);
}

bool cpu_memory_counting() { return detail::g_counting.load(std::memory_order_acquire); }

}  // namespace recompose
