// Ops that recompose runs for itself (copies to and from host memory, stashes of module state,
// copy-on-write clones of kept outputs, the views a swap re-creates) are not the user's ops:
// no region's op policy may decide on them and no region's trace may record them, or a nested or
// enclosing selective region would mistake them for the user's and replay the wrong tensors.
// See Note [ Internal ops ].
//
// InternalOpsGuard makes every op dispatched on this thread while it is alive invisible to the
// op interceptors of this thread (selective checkpointing's) and to dispatch modes: it excludes
// the dispatch keys through which ops reach them. Autograd and the kernels are unaffected.
// Implemented in dispatch_keys_adapter.cpp (LibTorch's thread-local dispatch keys).
#pragma once

#include <cstdint>

namespace recompose::detail {

class InternalOpsGuard {
 public:
  InternalOpsGuard();
  ~InternalOpsGuard();
  InternalOpsGuard(const InternalOpsGuard&) = delete;
  InternalOpsGuard& operator=(const InternalOpsGuard&) = delete;

 private:
  // A c10::impl::ExcludeDispatchKeyGuard, constructed in place by the adapter.
  alignas(8) unsigned char guard_[16];
};

}  // namespace recompose::detail
