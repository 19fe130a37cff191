// The C++ dispatch-mode adapter (lib/selective/dispatch_interceptor.cpp): proves that an
// OpInterceptor sees ATen ops below autograd and can replace their results. If a LibTorch
// upgrade breaks the c10::impl mechanism, these cases fail first.
#include "selective/dispatch_interceptor.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>
#include <thread>

using recompose::detail::active_interceptor_count;
using recompose::detail::InterceptorScope;
using recompose::detail::OpInterceptor;
using recompose::detail::run_below;

namespace {

// Counts ops by name and runs them.
struct Counter final : OpInterceptor {
  std::map<std::string, int> seen;
  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    ++seen[op.schema().name()];
    run_below(op, stack);
  }
  int operator[](const std::string& name) const {
    auto it = seen.find(name);
    return it == seen.end() ? 0 : it->second;
  }
};

}  // namespace

TEST_SUITE("dispatch_interceptor") {

TEST_CASE("an interceptor sees aten ops below autograd, and autograd still records them") {
  torch::Tensor a = torch::randn({3, 4}, torch::requires_grad());
  torch::Tensor b = torch::randn({4, 5}, torch::requires_grad());
  Counter counter;
  torch::Tensor y;
  {
    InterceptorScope scope(counter);
    CHECK(active_interceptor_count() == 1);
    y = torch::matmul(a, b).relu();  // matmul is composite: only mm reaches the Python key
  }
  CHECK(active_interceptor_count() == 0);
  INFO("ops seen: ", counter.seen.size());
  REQUIRE_MESSAGE(counter["aten::mm"] == 1,
                  "the C++ dispatch mode did not intercept aten::mm: the LibTorch dispatch-mode "
                  "internals (c10::impl::TorchDispatchModeTLS / PyInterpreterVTable) changed");
  CHECK(counter["aten::relu"] == 1);
  CHECK(counter["aten::matmul"] == 0);  // above autograd, decomposed
  REQUIRE(y.requires_grad());
  y.sum().backward();
  torch::Tensor a2 = a.detach().requires_grad_(), b2 = b.detach().requires_grad_();
  torch::matmul(a2, b2).relu().sum().backward();
  CHECK(torch::equal(a.grad(), a2.grad()));
  CHECK(torch::equal(b.grad(), b2.grad()));
}

TEST_CASE("factory ops without tensor arguments are intercepted too") {
  Counter counter;
  {
    InterceptorScope scope(counter);
    (void)torch::empty({2, 2});
  }
  CHECK(counter["aten::empty"] == 1);
}

TEST_CASE("ops run after the scope ends are not intercepted") {
  Counter counter;
  { InterceptorScope scope(counter); }
  (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  CHECK(counter.seen.empty());
}

TEST_CASE("a replaced result gets autograd history from the layers above") {
  // Replace mm's result by a fixed tensor: autograd attaches MmBackward to it, whose gradient
  // only needs the inputs, so the gradients are those of the real mm.
  struct Replace final : OpInterceptor {
    torch::Tensor fixed;
    void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
      if (op.schema().name() != "aten::mm") return run_below(op, stack);
      torch::jit::drop(*stack, op.schema().arguments().size());
      torch::jit::push(*stack, fixed.detach());  // a fresh TensorImpl
    }
  } replace;
  replace.fixed = torch::full({3, 5}, 7.0);
  torch::Tensor a = torch::randn({3, 4}, torch::requires_grad());
  torch::Tensor b = torch::randn({4, 5}, torch::requires_grad());
  torch::Tensor y;
  {
    InterceptorScope scope(replace);
    y = torch::mm(a, b);
  }
  CHECK(torch::equal(y, replace.fixed));
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "MmBackward0");
  y.sum().backward();
  CHECK(torch::allclose(a.grad(), torch::ones({3, 5}).mm(b.detach().t())));
  CHECK(torch::allclose(b.grad(), a.detach().t().mm(torch::ones({3, 5}))));
}

TEST_CASE("nested interceptors: run_below reaches the outer one, own ops skip the inner one") {
  struct Inner final : OpInterceptor {
    int calls = 0;
    void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
      ++calls;
      if (op.schema().name() == "aten::mm") (void)torch::ones({1}).clone();  // goes to the outer only
      run_below(op, stack);
    }
  } inner;
  Counter outer;
  torch::Tensor a = torch::ones({2, 2}), y;
  {
    InterceptorScope o(outer);
    InterceptorScope i(inner);
    CHECK(active_interceptor_count() == 2);
    y = torch::mm(a, a);
  }
  CHECK(inner.calls == 1);
  CHECK(outer["aten::mm"] == 1);
  CHECK(outer["aten::clone"] == 1);
  CHECK(torch::equal(y, torch::full({2, 2}, 2.0)));
}

TEST_CASE("run_below outside intercept() throws") {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::relu", "");
  torch::jit::Stack stack{torch::ones({1})};
  CHECK_THROWS_AS(run_below(op, &stack), c10::Error);
}

TEST_CASE("an exception from intercept() reaches the caller and the interceptor stays installed") {
  struct Failing final : OpInterceptor {
    int calls = 0;
    void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
      ++calls;
      if (op.schema().name() == "aten::sin") throw std::runtime_error("no sin here");
      run_below(op, stack);
    }
  } failing;
  InterceptorScope scope(failing);
  CHECK_THROWS_WITH(torch::sin(torch::ones({2})), doctest::Contains("no sin here"));
  CHECK(active_interceptor_count() == 1);
  (void)torch::cos(torch::ones({2}));
  CHECK(failing.calls >= 2);
}

TEST_CASE("interceptors are per thread") {
  Counter counter;
  InterceptorScope scope(counter);
  std::thread([] { (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2})); }).join();
  CHECK(counter["aten::mm"] == 0);
  (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  CHECK(counter["aten::mm"] == 1);
}

}  // TEST_SUITE
