#include "device_memory.h"

#include <recompose/device_memory.h>

#include <c10/core/CPUAllocator.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

namespace gpt {
namespace {

// Delegates to LibTorch's default CPU allocator and keeps current and peak bytes. The data
// pointer doubles as the context (as in the default allocator), so raw_allocate keeps working.
class CountingCPUAllocator final : public c10::Allocator {
 public:
  explicit CountingCPUAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    if (data == nullptr || inner.get_context() != data ||
        inner.get_deleter() != inner_->raw_deleter()) {
      return inner;  // not the shape we expect: pass it through uncounted
    }
    inner.release_context();  // ownership moves to the DataPtr returned below
    {
      std::lock_guard lock(mutex_);
      sizes_[data] = n;
    }
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &CountingCPUAllocator::free, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCPUAllocator::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void reset_peak() { peak_ = current_.load(); }
  int64_t peak() const { return peak_.load(); }
  int64_t current() const { return current_.load(); }

  static CountingCPUAllocator* instance;

 private:
  static void free(void* data) {
    auto* self = instance;
    size_t n = 0;
    {
      std::lock_guard lock(self->mutex_);
      auto it = self->sizes_.find(data);
      if (it != self->sizes_.end()) {
        n = it->second;
        self->sizes_.erase(it);
      }
    }
    self->current_ -= static_cast<int64_t>(n);
    self->inner_->raw_deleter()(data);
  }

  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

CountingCPUAllocator* CountingCPUAllocator::instance = nullptr;

}  // namespace

void install_cpu_memory_counter() {
  if (CountingCPUAllocator::instance) return;
  c10::Allocator* inner = c10::GetCPUAllocator();
  if (inner->raw_deleter() == nullptr) return;  // an allocator we cannot wrap: report 0 on CPU
  // Never destroyed: tensors may outlive main().
  CountingCPUAllocator::instance = new CountingCPUAllocator(inner);
  c10::SetCPUAllocator(CountingCPUAllocator::instance, /*priority=*/1);
}

void reset_peak_memory(const torch::Device& device) {
  recompose::reset_peak_device_memory(device);
  if (device.is_cpu() && CountingCPUAllocator::instance)
    CountingCPUAllocator::instance->reset_peak();
}

int64_t peak_memory(const torch::Device& device) {
  if (device.is_cuda()) return recompose::peak_device_memory(device);
  return device.is_cpu() && CountingCPUAllocator::instance ? CountingCPUAllocator::instance->peak()
                                                           : 0;
}

int64_t current_memory(const torch::Device& device) {
  if (device.is_cuda()) return recompose::current_device_memory(device);
  return device.is_cpu() && CountingCPUAllocator::instance
             ? CountingCPUAllocator::instance->current()
             : 0;
}

bool cap_device_memory(const torch::Device& device, double fraction) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    // The cap counts what the allocator reserved, its cached free blocks included: what the
    // process cached before (a profile taken uncapped) goes back to the device first. The
    // allocator exists only after CUDA's lazy initialisation (a cap set before the first
    // allocation would throw "did you call init?").
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       device.has_index() ? device.index() : 0);
    return true;
  }
#endif
  (void)device;
  (void)fraction;
  return false;
}

void synchronize(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
#else
  (void)device;
#endif
}

}  // namespace gpt
