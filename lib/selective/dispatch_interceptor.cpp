// The LibTorch adapter for dispatch modes (one of those listed in docs/architecture.md): a pure
// C++ "Python interpreter" whose dispatch() runs recompose::detail::OpInterceptor objects.
//
// How the pieces fit (read from the LibTorch sources of the versions below):
//  - TorchDispatchModeTLS::push_non_infra_mode_onto_stack() puts a mode object
//    (SafePyObjectT = PyObject* + PyInterpreter*) on a thread-local stack and,
//    for the first mode, adds the Python and PythonTLSSnapshot keys to the
//    thread's included dispatch keys; pop_stack() removes them with the last.
//  - The PythonTLSSnapshot fallback (highest key) records the key TLS and
//    redispatches. The Python fallback (pythonFallback, just below autograd,
//    ADInplaceOrView, autocast, functionalize...) excludes every key above
//    Python for the rest of the call, and calls
//    top_mode->pyinterpreter()->dispatch(op, stack). It does NOT pop the mode
//    and does NOT exclude Python: calling the op again from dispatch() would
//    come straight back here. Python's TorchDispatchMode pops the mode while
//    __torch_dispatch__ runs; we do the same.
//  - While any mode is on the stack and Python is not excluded,
//    TensorImpl::shallow_copy_and_detach() (detach(), tensor_data(), saved
//    variables...) asks the top mode's interpreter for detach(): it is called
//    often during a forward pass and must really work.
//  - SafePyObject only calls incref()/decref() on its interpreter and compares
//    interpreter pointers in ptr(); nothing else looks at the PyObject*. Our
//    "PyObject*" is a pointer to a reference-counted ModeRecord.

#include "dispatch_interceptor.h"

#include <recompose/checkpoint_error.h>

#include "engine/dispatch_mode_keys.h"
// The version range every adapter was checked against (one list for all of them).
#include "engine/torch_version_guard.h"

// Checked: PyInterpreterVTable's pure virtuals, the TorchDispatchModeTLS API and SafePyObject are
// the same in every version of the range; pythonFallback's behaviour is pinned by the selective
// and interceptor test suites, run on each version by scripts/test-versions.sh.
#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/selective/dispatch_interceptor.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check c10/core/impl/PyInterpreter.h (pure virtuals), \
c10/core/impl/TorchDispatchModeTLS.h, c10/core/SafePyObject.h and \
aten/src/ATen/core/PythonFallbackKernel.cpp, then extend torch_version_guard.h"
#endif

#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/SafePyObject.h>
#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

namespace recompose::detail {
namespace {

using c10::impl::PyInterpreter;
using c10::impl::TorchDispatchModeTLS;
using Mode = c10::impl::PyObject_TorchDispatchMode;

// What our fake PyObject* points at. Reference-counted through the
// interpreter's incref/decref because mode objects can be copied into
// at::ThreadLocalState snapshots that outlive the InterceptorScope; a snapshot
// restored later finds interceptor == nullptr and passes ops through.
struct ModeRecord {
  std::atomic<size_t> refs{1};  // SafePyObject's constructor steals one reference
  std::atomic<OpInterceptor*> interceptor;
  explicit ModeRecord(OpInterceptor* i) : interceptor(i) {}
};

// Inside-intercept() depth and suspended (temporarily popped) modes, this thread.
thread_local size_t t_intercept_depth = 0;
thread_local size_t t_suspended = 0;
// The dispatch-key state the innermost intercept() was entered with: what run_below restores.
thread_local const c10::impl::LocalDispatchKeySet* t_keys_on_entry = nullptr;

[[noreturn]] void unsupported(const char* what) {
  throw CheckpointError(
      std::string("recompose: selective checkpoint: PyInterpreterVTable::") + what +
      " was called, but recompose's C++ op interceptor has no Python objects. Selective "
      "checkpointing cannot be mixed with another TorchDispatchMode or a Python tensor "
      "subclass: remove the policy of the regions that run them.");
}

struct CppInterpreterVTable final : c10::impl::PyInterpreterVTable {
  std::string name() const override { return "recompose C++ OpInterceptor"; }

  // Only our ModeRecord tokens ever reach these (SafePyObject copy/destroy).
  void incref(PyObject* obj) const override {
    if (obj != nullptr)
      reinterpret_cast<ModeRecord*>(obj)->refs.fetch_add(1, std::memory_order_relaxed);
  }
  void decref(PyObject* obj) const override {
    if (obj == nullptr) return;
    auto* rec = reinterpret_cast<ModeRecord*>(obj);
    if (rec->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete rec;
  }
  bool try_incref(const c10::impl::PyObjectSlot&) const override {
    return false;  // no tensor ever carries a PyObject of this interpreter
  }
  size_t refcnt(PyObject* obj) const override {
    return obj == nullptr ? 0 : reinterpret_cast<ModeRecord*>(obj)->refs.load();
  }

  // Called by TensorImpl::shallow_copy_and_detach while one of our modes is on
  // the stack. Excluding Python makes that same function take its plain path
  // (copy the TensorImpl metadata, share the storage); the caller then sets the
  // version counter and allow_tensor_metadata_change it wants.
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl* self) const override {
    c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
    return self->shallow_copy_and_detach(self->version_counter(),
                                         self->allow_tensor_metadata_change());
  }

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override;

  void reportErrorCallback(PyObject*, c10::DispatchKey) const override {
    unsupported("reportErrorCallback");
  }
  void python_op_registration_trampoline(const c10::OperatorHandle&, c10::DispatchKey,
                                         c10::DispatchKeySet, torch::jit::Stack*, bool,
                                         bool) const override {
    unsupported("python_op_registration_trampoline");
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                              const char* context) const override {
    throw CheckpointError("recompose: selective checkpoint: operator " + opname +
                          " needs a Python abstract implementation (module " +
                          (pymodule ? pymodule : "?") + ", " + (context ? context : "") +
                          "), which is not available in a C++-only "
                          "program: keep this op out of selectively checkpointed regions.");
  }
  void python_dispatcher(const c10::OperatorHandle&, c10::DispatchKeySet,
                         torch::jit::Stack*) const override {
    unsupported("python_dispatcher");
  }

  // Size/stride queries only go to the interpreter of tensors with a Python
  // sizes/strides policy (Python subclasses): never ours.
  bool is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override {
    unsupported("is_contiguous");
  }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override {
    unsupported("sym_is_contiguous");
  }
  bool is_strides_like(const c10::TensorImpl*, at::MemoryFormat) const override {
    unsupported("is_strides_like");
  }
  bool is_non_overlapping_and_dense(const c10::TensorImpl*) const override {
    unsupported("is_non_overlapping_and_dense");
  }
  c10::Device device(const c10::TensorImpl*) const override { unsupported("device"); }
  int64_t dim(const c10::TensorImpl*) const override { unsupported("dim"); }
  c10::IntArrayRef strides(const c10::TensorImpl*) const override { unsupported("strides"); }
  c10::IntArrayRef sizes(const c10::TensorImpl*) const override { unsupported("sizes"); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl*) const override { unsupported("sym_sizes"); }
  c10::Layout layout(const c10::TensorImpl*) const override { unsupported("layout"); }
  int64_t numel(const c10::TensorImpl*) const override { unsupported("numel"); }
  c10::SymInt sym_numel(const c10::TensorImpl*) const override { unsupported("sym_numel"); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl*) const override {
    unsupported("sym_strides");
  }
  c10::SymInt sym_storage_offset(const c10::TensorImpl*) const override {
    unsupported("sym_storage_offset");
  }

  // GPU tracing hooks (torch.cuda._sanitizer): nothing to trace.
  void trace_gpu_event_creation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_deletion(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_record(c10::DeviceType, uintptr_t, uintptr_t) const override {}
  void trace_gpu_event_wait(c10::DeviceType, uintptr_t, uintptr_t) const override {}
  void trace_gpu_memory_allocation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_memory_deallocation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_stream_creation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_device_synchronization(c10::DeviceType) const override {}
  void trace_gpu_stream_synchronization(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_event_synchronization(c10::DeviceType, uintptr_t) const override {}

  void reset_backward_hooks(const c10::TensorImpl*) const override {}  // no Python hooks
};

// Leaked on purpose: mode objects (and tensors) may be destroyed during static
// destruction, after a function-local static would be gone.
PyInterpreter* interpreter() {
  static PyInterpreter* interp = new PyInterpreter(new CppInterpreterVTable());
  return interp;
}

ModeRecord* record_of(const Mode& mode) {
  return reinterpret_cast<ModeRecord*>(mode.ptr(interpreter()));
}

bool is_ours(const Mode& mode) { return &mode.pyinterpreter() == interpreter(); }

// Pops the innermost mode (the one pythonFallback chose) for the duration of
// intercept(), so that ops issued from there (run_below, detach, clone...) do
// not come back to the same interceptor. Re-pushes it afterwards, also when
// intercept() throws, unless its scope ended in the meantime.
class SuspendTopMode {
 public:
  SuspendTopMode(const Mode* expected, bool alive) : alive_(alive) {
    popped_ = TorchDispatchModeTLS::pop_stack();
    // pythonFallback calls the top of the logical stack, which is the back of
    // the user-mode stack whenever that one is non-empty (ours always is).
    if (popped_.get() != expected) {
      throw CheckpointError(
          "recompose: selective checkpoint: internal error: the dispatch mode stack changed under "
          "the "
          "Python fallback (is another TorchDispatchMode pushed from a selective policy?). Please "
          "report "
          "this with the program that triggers it.");
    }
    if (alive_) ++t_suspended;
  }
  ~SuspendTopMode() {
    if (alive_) --t_suspended;
    if (record_of(*popped_)->interceptor.load() != nullptr) {
      TorchDispatchModeTLS::push_non_infra_mode_onto_stack(std::move(popped_));
    }
  }
  SuspendTopMode(const SuspendTopMode&) = delete;
  SuspendTopMode& operator=(const SuspendTopMode&) = delete;

 private:
  std::shared_ptr<Mode> popped_;
  bool alive_;
};

// While intercept() runs: its depth, and the key state that run_below gives back to the op.
class InterceptFrame {
 public:
  InterceptFrame() : keys_(c10::impl::tls_local_dispatch_key_set()), outer_keys_(t_keys_on_entry) {
    ++t_intercept_depth;
    t_keys_on_entry = &keys_;
  }
  ~InterceptFrame() {
    t_keys_on_entry = outer_keys_;
    --t_intercept_depth;
  }
  InterceptFrame(const InterceptFrame&) = delete;
  InterceptFrame& operator=(const InterceptFrame&) = delete;

 private:
  c10::impl::LocalDispatchKeySet keys_;
  const c10::impl::LocalDispatchKeySet* outer_keys_;
};

void CppInterpreterVTable::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const {
  // Here pythonFallback has already excluded every key above Python, so all
  // dispatches from this frame run below autograd (and are not recorded).
  const int64_t len = TorchDispatchModeTLS::stack_len();
  if (len <= 0) {
    throw CheckpointError(
        "recompose: selective checkpoint: internal error: the Python fallback was reached "
        "without a dispatch mode. Please report this with the program that triggers it.");
  }
  const Mode* top = TorchDispatchModeTLS::get_stack_at(len - 1).get();
  if (!is_ours(*top)) {
    throw CheckpointError(
        "recompose: selective checkpoint: a dispatch mode that is not recompose's is the "
        "innermost one; selective checkpointing cannot be mixed with another "
        "TorchDispatchMode.");
  }
  OpInterceptor* interceptor = record_of(*top)->interceptor.load();

  SuspendTopMode suspend(top, interceptor != nullptr);  // `top` may dangle from here on
  if (interceptor == nullptr) {
    // A stale copy of a finished scope's mode (restored from an
    // at::ThreadLocalState snapshot): behave as if it were not installed.
    op.callBoxed(stack);
    return;
  }
  InterceptFrame frame;
  // Ops that intercept() runs itself (clones, detaches, the policy's ops, swap copies...) are
  // not the program's: no interceptor, this one or an outer one, may see them. Only run_below
  // hands an op on, with the key state restored.
  c10::impl::ExcludeDispatchKeyGuard hide_own_ops(kModeKeys);
  interceptor->intercept(op, stack);
}

}  // namespace

void run_below(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (t_intercept_depth == 0 || t_keys_on_entry == nullptr) {
    throw CheckpointError(
        "recompose: detail::run_below called outside OpInterceptor::intercept(): call it "
        "only from an interceptor, for the op it was handed");
  }
  // The calling interceptor is popped (SuspendTopMode); the key state of intercept()'s entry
  // (keys above Python excluded by pythonFallback's guard, Python not excluded) is put back for
  // the call: it goes to the next outer interceptor through the Python key, or, with none left
  // (Python no longer included), straight to the backend kernels.
  c10::impl::ForceDispatchKeyGuard entry_keys(*t_keys_on_entry);
  op.callBoxed(stack);
}

InterceptorScope::InterceptorScope(OpInterceptor& interceptor) {
  auto* rec = new ModeRecord(&interceptor);
  // SafePyObjectT steals the record's initial reference; decref deletes it.
  auto mode = std::make_shared<Mode>(reinterpret_cast<PyObject*>(rec), interpreter());
  // Also includes the Python and PythonTLSSnapshot keys if this is the first mode.
  TorchDispatchModeTLS::push_non_infra_mode_onto_stack(mode);
  mode_ = std::move(mode);
}

InterceptorScope::~InterceptorScope() {
  const Mode* mine = static_cast<const Mode*>(mode_.get());
  // Stale copies of the mode (thread-local-state snapshots) pass ops through from now on.
  record_of(*mine)->interceptor.store(nullptr);

  // Normal case: we are the innermost mode. Otherwise pop the modes above us,
  // drop ours, and push them back (pop_stack only pops the top).
  std::vector<std::shared_ptr<Mode>> above;
  bool found = false;
  try {
    while (TorchDispatchModeTLS::stack_len() > 0) {
      std::shared_ptr<Mode> top = TorchDispatchModeTLS::pop_stack();
      if (top.get() == mine) {
        found = true;
        break;
      }
      above.push_back(std::move(top));
    }
    for (auto it = above.rbegin(); it != above.rend(); ++it) {
      TorchDispatchModeTLS::push_non_infra_mode_onto_stack(std::move(*it));
    }
  } catch (...) {
    // pop/push only throw on an empty stack, which the loop condition prevents.
  }
  try {  // a warning handler may turn warnings into exceptions: not from a destructor
    if (!found) {
      // Our mode is suspended (scope destroyed inside its own intercept();
      // SuspendTopMode will not re-push it) or the TLS was replaced.
      TORCH_WARN(
          "recompose: InterceptorScope destroyed while its mode was not on this thread's "
          "dispatch mode stack (destroyed inside its own intercept() or on another thread?)");
    } else if (!above.empty()) {
      TORCH_WARN("recompose: InterceptorScope destroyed out of LIFO order; ", above.size(),
                 " inner dispatch mode(s) kept installed");
    }
  } catch (...) {
  }
}

size_t active_interceptor_count() {
  size_t n = t_suspended;
  const int64_t len = TorchDispatchModeTLS::stack_len();
  for (int64_t i = 0; i < len; ++i) {
    const auto& mode = TorchDispatchModeTLS::get_stack_at(i);
    if (is_ours(*mode) && record_of(*mode)->interceptor.load() != nullptr) ++n;
  }
  return n;
}

}  // namespace recompose::detail
