// KernelsOnlyGuard: while alive, ops dispatched on this thread go straight to their kernels
// (backend select and the backend): no autograd, no ADInplaceOrView, no autocast, no dispatch
// mode. What a replay of a region's recorded ops needs: each op was recorded as it reached the
// kernels in the forward, after autocast and below autograd, and must run exactly so again.
// Implemented in dispatch_keys_adapter.cpp (LibTorch's thread-local dispatch keys).
#pragma once

namespace recompose::detail {

class KernelsOnlyGuard {
 public:
  KernelsOnlyGuard();
  ~KernelsOnlyGuard();
  KernelsOnlyGuard(const KernelsOnlyGuard&) = delete;
  KernelsOnlyGuard& operator=(const KernelsOnlyGuard&) = delete;

 private:
  // A c10::impl::ExcludeDispatchKeyGuard, constructed in place by the adapter.
  alignas(8) unsigned char guard_[16];
};

}  // namespace recompose::detail
