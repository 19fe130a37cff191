#pragma once
// Op-level interception below autograd, in pure C++ (what a Python TorchDispatchMode does, without
// being one: see Note [ Interception without a dispatch mode ]). Used by selective activation
// checkpointing to see, cache and replay ATen ops.
//
// This header uses no LibTorch-internal (impl) API: everything that depends on
// LibTorch internals lives in dispatch_interceptor.cpp (one version-guarded file).

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>

namespace recompose::detail {

// Sees every ATen operator dispatched below autograd on the thread where it is
// installed (also ops with no tensor arguments, such as factory functions).
//
// While intercept() runs, this interceptor is suspended and autograd is off.
// ATen ops that intercept() runs itself (detach(), clone(), a policy's ops,
// copies...) go straight to the kernels: no interceptor sees them, neither
// this one nor an outer one (they are recompose's ops, not the program's, and
// an outer selective region must not record or replay them), and autograd
// does not record them. Only run_below hands the intercepted op on.
class OpInterceptor {
 public:
  virtual ~OpInterceptor() = default;
  // Either call run_below(op, stack) to execute the op (its arguments on the
  // stack are replaced by its results), or pop the arguments yourself
  // (op.schema().arguments().size() values) and push replacement results
  // (op.schema().returns().size() values).
  //
  // Replacement tensors get autograd history attached by the layers above, so
  // each pushed tensor must be a TensorImpl that nobody else uses as an
  // autograd variable: push `cached.detach()` (a fresh TensorImpl sharing the
  // storage), never the op's original output and never the same TensorImpl
  // twice. A replacement for a view op (view, t, transpose, ...) does not alias
  // the op's input; replay view ops with run_below instead.
  //
  // Exceptions thrown here propagate to the caller of the op.
  virtual void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) = 0;
};

// Executes op beneath the interceptor that is currently handling it (outer
// interceptors, if any, still see it), with the dispatch-key state the op
// arrived with. Only valid inside intercept() on the same thread, for the op it
// was handed, with the arguments it came with (beneath the outermost
// interceptor the op goes on with the keys it was dispatched with); throws
// outside intercept().
void run_below(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// RAII: installs `interceptor` as the innermost interceptor of this thread;
// removes it on destruction (must be LIFO; a non-LIFO destruction is repaired
// with a warning). `interceptor` must outlive the scope. The scope must be
// destroyed on the thread that created it.
class InterceptorScope {
 public:
  explicit InterceptorScope(OpInterceptor& interceptor);
  ~InterceptorScope();
  InterceptorScope(const InterceptorScope&) = delete;
  InterceptorScope& operator=(const InterceptorScope&) = delete;
  InterceptorScope(InterceptorScope&&) = delete;
  InterceptorScope& operator=(InterceptorScope&&) = delete;

 private:
  OpInterceptor* interceptor_;
};

// Number of interceptors installed on this thread (0 when none), including one
// that is currently suspended because its intercept() is running.
size_t active_interceptor_count();

}  // namespace recompose::detail
