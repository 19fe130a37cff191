// The LibTorch adapter for op interception (one of those listed in docs/architecture.md): a boxed
// backend fallback on a dispatch key that LibTorch itself never uses, run below autograd, whose
// per-thread stack of recompose::detail::OpInterceptor objects sees every op of the thread. See
// Note [ Interception without a dispatch mode ].
//
// How the pieces fit (read from the LibTorch sources of the versions below):
//  - DispatchKey::Fake is an out-of-tree functionality key (torchdistx's fake tensors): no kernel
//    or fallback of LibTorch is registered on it, and it sits just above Python, below
//    Functionalize, ADInplaceOrView, autograd and autocast: an op reaches it after every
//    composite op above has decomposed, exactly where a Python dispatch mode would see it.
//  - A functionality key in the thread's included set takes part in every dispatch on the thread
//    (tensor keys | included - excluded); our fallback is registered once, on first use, and
//    refuses to share the key with another library's fallback.
//  - Unlike a dispatch mode (TorchDispatchModeTLS), the key makes no tensor "subclass-like":
//    c10::impl::dispatch_mode_enabled() stays false, so ATen's composite ops that branch on
//    at::isTensorSubclassLike take the same path inside a region as outside it.
//  - The fallback excludes every key above ours for the rest of the call, as the Python fallback
//    does, so that what intercept() dispatches runs below autograd; run_below gives the op back
//    that key state, and the interceptor's own stack level decides where it goes next.

#include "dispatch_interceptor.h"

#include <recompose/checkpoint_error.h>

#include "engine/dispatch_mode_keys.h"
// The version range every adapter was checked against (one list for all of them).
#include "engine/torch_version_guard.h"

// Checked: DispatchKey::Fake's place in the key order and that LibTorch registers nothing on it,
// Dispatcher::hasBackendFallbackForDispatchKey, torch::Library's fallback registration and the
// thread-local dispatch-key API are the same in every version of the range; the interceptor's
// behaviour is pinned by the selective and interceptor test suites, run on each version by
// scripts/test-versions.sh.
#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/selective/dispatch_interceptor.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check that c10/core/DispatchKey.h still places Fake between \
Python and Functionalize and that nothing in LibTorch registers on it, \
c10/core/impl/LocalDispatchKeySet.h and ATen/core/dispatch/Dispatcher.h (backend fallbacks), \
then extend torch_version_guard.h"
#endif

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace recompose::detail {
namespace {

// Every key that an op has passed when it reaches ours (autograd, ADInplaceOrView, autocast,
// functionalize, functorch, tracing), and every key it has still to pass (Python's modes, backend
// select, the backends).
const c10::DispatchKeySet kBelowIntercept(c10::DispatchKeySet::FULL_AFTER, kInterceptKey);
const c10::DispatchKeySet kAboveIntercept = c10::DispatchKeySet(c10::DispatchKeySet::FULL) -
                                            kBelowIntercept - c10::DispatchKeySet(kInterceptKey);

// This thread's installed interceptors, innermost last.
thread_local std::vector<OpInterceptor*> t_installed;
// While an interceptor's intercept() runs: its level in t_installed. Only the levels below it see
// the op that run_below hands on; SIZE_MAX outside any intercept().
thread_local size_t t_visible_levels = std::numeric_limits<size_t>::max();

// While intercept() runs: which levels see what it hands on, the key state of its entry (what
// run_below restores) and the keys the op was dispatched with.
class InterceptFrame {
 public:
  InterceptFrame(size_t level, c10::DispatchKeySet op_keys,
                 const c10::impl::LocalDispatchKeySet& entry_keys)
      : keys_(entry_keys),
        op_keys_(op_keys),
        level_(level),
        outer_(t_frame),
        outer_visible_(t_visible_levels) {
    t_frame = this;
    t_visible_levels = level;
  }
  ~InterceptFrame() {
    t_visible_levels = outer_visible_;
    t_frame = outer_;
  }
  InterceptFrame(const InterceptFrame&) = delete;
  InterceptFrame& operator=(const InterceptFrame&) = delete;

  // The innermost intercept()'s frame; nullptr outside any.
  static InterceptFrame* innermost() { return t_frame; }
  const c10::impl::LocalDispatchKeySet& entry_keys() const { return keys_; }
  c10::DispatchKeySet op_keys() const { return op_keys_; }
  size_t level() const { return level_; }

 private:
  static thread_local InterceptFrame* t_frame;
  c10::impl::LocalDispatchKeySet keys_;
  c10::DispatchKeySet op_keys_;
  size_t level_;
  InterceptFrame* outer_;
  size_t outer_visible_;
};

thread_local InterceptFrame* InterceptFrame::t_frame = nullptr;

void intercept_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack) {
  const size_t levels = std::min(t_visible_levels, t_installed.size());
  if (levels == 0) {
    // No interceptor on this thread sees it (another thread's included keys, restored from an
    // at::ThreadLocalState snapshot, or the outermost level's run_below): on to the kernels.
    op.redispatchBoxed(keys & kBelowIntercept, stack);
    return;
  }
  OpInterceptor* interceptor = t_installed[levels - 1];
  // The keys above ours are done with this op: what intercept() dispatches runs below autograd
  // and autocast (autograd does not record it), as under a Python dispatch mode. run_below hands
  // the op on in that key state (the frame's).
  c10::impl::LocalDispatchKeySet entry_keys = c10::impl::tls_local_dispatch_key_set();
  entry_keys.excluded_ = entry_keys.excluded_ | kAboveIntercept;
  InterceptFrame frame(levels - 1, keys, entry_keys);
  // Ops that intercept() runs itself (clones, detaches, the policy's ops, swap copies...) are
  // not the program's: no interceptor, this one or an outer one, may see them. Only run_below
  // hands an op on, with the key state restored. One guard for both sets: one write of the
  // thread's key state, and on exit the keys it excluded, and only those, included again.
  c10::impl::ExcludeDispatchKeyGuard below_autograd_own_ops_hidden(kAboveIntercept | kModeKeys);
  interceptor->intercept(op, stack);
}

// Registers the fallback on first use (not at load: a library that claims the key first is
// reported, not a crash at start-up). Never destroyed: the registration must outlive every
// tensor destroyed during static destruction. Held by a static pointer, so that it stays
// reachable and LeakSanitizer reports only real leaks; [[gnu::used]], because GCC removes a
// static that is written and never read (at -O2), and the pointer with it.
void register_fallback_once() {
  [[gnu::used]] static torch::Library* const registration = [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kInterceptKey)) {
      throw CheckpointError(
          std::string("recompose: selective checkpoint: another library registered a fallback "
                      "on the dispatch key ") +
          c10::toString(kInterceptKey) +
          ", which recompose intercepts ops with (torchdistx's fake tensors use it): selective "
          "checkpointing cannot run in the same process; use full checkpointing (no policy).");
    }
    auto* library =
        new torch::Library(torch::Library::IMPL, "_", kInterceptKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&intercept_fallback>());
    return library;
  }();
  (void)registration;
}

}  // namespace

void run_below(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const InterceptFrame* frame = InterceptFrame::innermost();
  if (frame == nullptr) {
    throw CheckpointError(
        "recompose: detail::run_below called outside OpInterceptor::intercept(): call it "
        "only from an interceptor, for the op it was handed");
  }
  // The key state of intercept()'s entry (keys above ours excluded, ours included while any
  // interceptor is installed), which the op's kernels run under.
  c10::impl::ForceDispatchKeyGuard entry_keys(frame->entry_keys());
  if (frame->level() == 0) {
    // No outer level to see it: straight on to the keys below ours, with the keys the op came
    // with (its arguments are the ones it came with), rather than a second trip through the
    // dispatcher and the fallback, which would only hand it on.
    op.redispatchBoxed(frame->op_keys() & kBelowIntercept, stack);
    return;
  }
  // The op comes back to the fallback, which hands it to the next outer level.
  op.callBoxed(stack);
}

InterceptorScope::InterceptorScope(OpInterceptor& interceptor) : interceptor_(&interceptor) {
  register_fallback_once();
  t_installed.push_back(&interceptor);
  c10::impl::tls_set_dispatch_key_included(kInterceptKey, true);
}

InterceptorScope::~InterceptorScope() {
  // Normal case: ours is the innermost. Otherwise drop ours from the middle (the inner ones stay
  // installed).
  const auto mine = std::find(t_installed.rbegin(), t_installed.rend(), interceptor_);
  const bool found = mine != t_installed.rend();
  const bool innermost = mine == t_installed.rbegin();
  if (found) t_installed.erase(std::next(mine).base());
  if (t_installed.empty()) c10::impl::tls_set_dispatch_key_included(kInterceptKey, false);
  try {  // a warning handler may turn warnings into exceptions: not from a destructor
    if (!found) {
      TORCH_WARN(
          "recompose: InterceptorScope destroyed on a thread where its interceptor is not "
          "installed (it must be destroyed on the thread that created it)");
    } else if (!innermost) {
      TORCH_WARN(
          "recompose: InterceptorScope destroyed out of LIFO order; the inner interceptors stay "
          "installed");
    }
  } catch (...) {
  }
}

size_t active_interceptor_count() { return t_installed.size(); }

}  // namespace recompose::detail
