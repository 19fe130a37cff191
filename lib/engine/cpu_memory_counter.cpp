// recompose::CpuMemoryCounting: a counting wrapper around c10's CPU allocator.
#include "engine/cpu_memory_counter.h"

#include <recompose/checkpoint_error.h>
#include <recompose/cpu_memory_counting.h>

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace recompose {
namespace detail {
namespace {

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
    if (entry.deleter != nullptr) entry.deleter(data);
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
