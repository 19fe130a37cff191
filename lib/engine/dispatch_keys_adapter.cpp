// Adapter: LibTorch's thread-local dispatch-key sets (c10::impl::LocalDispatchKeySet), behind
// InternalOpsGuard and KernelsOnlyGuard. One of the LibTorch adapters (docs/architecture.md).
#include "engine/dispatch_mode_keys.h"
#include "engine/internal_ops.h"
#include "engine/kernels_only.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/dispatch_keys_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check c10/core/impl/LocalDispatchKeySet.h (ExcludeDispatchKeyGuard) \
and the Python/PythonTLSSnapshot keys in c10/core/DispatchKey.h, then extend torch_version_guard.h"
#endif

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <new>

namespace recompose::detail {
namespace {

using Guard = c10::impl::ExcludeDispatchKeyGuard;
static_assert(sizeof(Guard) <= 16 && alignof(Guard) <= 8, "resize InternalOpsGuard::guard_");

// Python (the dispatch modes), recompose's interceptor key (kInterceptKey, just above Python) and
// every key above them: autograd, ADInplaceOrView, autocast, functorch, tracing. What stays are
// the keys below Python: backend select and the backends.
const c10::DispatchKeySet kAboveKernels =
    c10::DispatchKeySet(c10::DispatchKeySet::FULL) -
    c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Python);

}  // namespace

KernelsOnlyGuard::KernelsOnlyGuard() { new (guard_) Guard(kAboveKernels); }
KernelsOnlyGuard::~KernelsOnlyGuard() { std::launder(reinterpret_cast<Guard*>(guard_))->~Guard(); }

InternalOpsGuard::InternalOpsGuard() { new (guard_) Guard(kModeKeys); }
InternalOpsGuard::~InternalOpsGuard() { std::launder(reinterpret_cast<Guard*>(guard_))->~Guard(); }

}  // namespace recompose::detail
