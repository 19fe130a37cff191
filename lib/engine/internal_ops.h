// Ops that recompose runs for itself (copies to and from host memory, stashes of module state,
// copy-on-write clones of kept outputs, the views a swap re-creates) are not the user's ops:
// no region's op policy may decide on them and no op log may record them, or a nested or
// enclosing selective region would mistake them for the user's and replay the wrong tensors.
//
// InternalOpsGuard makes every op dispatched on this thread while it is alive invisible to the
// dispatch modes of this thread (selective checkpointing's op interceptors): it excludes the
// dispatch keys through which LibTorch hands ops to a mode. Autograd and the kernels are
// unaffected.
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace recompose::detail {

class InternalOpsGuard {
 public:
  InternalOpsGuard() = default;
  InternalOpsGuard(const InternalOpsGuard&) = delete;
  InternalOpsGuard& operator=(const InternalOpsGuard&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard exclude_{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})};
};

}  // namespace recompose::detail
