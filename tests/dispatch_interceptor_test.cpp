// The C++ dispatch-mode adapter (lib/selective/dispatch_interceptor.cpp): proves that an
// OpInterceptor sees ATen ops below autograd and can replace their results. If a LibTorch
// upgrade breaks the c10::impl mechanism, these cases fail first.
#include "selective/dispatch_interceptor.h"

#include <recompose/checkpoint_error.h>

#include "engine/internal_ops.h"
#include "support/op_call_counter.h"

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

  TEST_CASE(
      "nested interceptors: run_below reaches the outer one; ops intercept() runs itself reach "
      "none") {
    struct Inner final : OpInterceptor {
      int calls = 0;
      void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
        ++calls;
        if (op.schema().name() == "aten::mm")
          (void)torch::ones({1}).clone();  // the interceptor's own op
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
    CHECK(outer["aten::clone"] == 0);  // an outer interceptor must not mistake it for the program's
    CHECK(outer["aten::ones"] == 0);
    CHECK(torch::equal(y, torch::full({2, 2}, 2.0)));
  }

  TEST_CASE("an op handed on by the only interceptor reaches its kernel once, seen once") {
    // run_below at the outermost level goes straight to the keys below the interceptor's: the
    // kernel runs once, and RecordFunction (profilers) sees the op once, as without interception.
    Counter counter;
    torch::Tensor a = torch::ones({3}), y;
    rt::OpCallCounter adds("aten::add");
    {
      InterceptorScope scope(counter);
      y = torch::add(a, a);
    }
    CHECK(counter["aten::add"] == 1);
    CHECK(adds.calls() == 1);
    CHECK(torch::equal(y, torch::full({3}, 2.0)));
  }

  TEST_CASE("run_below outside intercept() throws") {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::relu", "");
    torch::jit::Stack stack{torch::ones({1})};
    CHECK_THROWS_AS(run_below(op, &stack), recompose::CheckpointError);
  }

  TEST_CASE(
      "an exception from intercept() reaches the caller and the interceptor stays installed") {
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

  TEST_CASE(
      "ops intercept() runs itself reach no interceptor, also from nested intercept() calls") {
    // The inner interceptor runs its own ops; the middle one sees the mm through run_below and runs
    // its own op too; the outer one sees only the mm.
    struct Runs final : OpInterceptor {
      Counter* log;
      explicit Runs(Counter* l) : log(l) {}
      void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
        ++log->seen[op.schema().name()];
        (void)torch::zeros({2}).add(1).sum().item<float>();
        run_below(op, stack);
        (void)torch::ones({2}).detach().clone();
      }
    };
    Counter inner_log, middle_log;
    Runs inner(&inner_log), middle(&middle_log);
    Counter outer;
    torch::Tensor a = torch::ones({2, 2}), y;
    {
      InterceptorScope o(outer);
      InterceptorScope m(middle);
      InterceptorScope i(inner);
      y = torch::mm(a, a);
      CHECK(active_interceptor_count() == 3);
    }
    CHECK(inner_log.seen == std::map<std::string, int>{{"aten::mm", 1}});
    CHECK(middle_log.seen == std::map<std::string, int>{{"aten::mm", 1}});
    CHECK(outer.seen == std::map<std::string, int>{{"aten::mm", 1}});
    CHECK(torch::equal(y, torch::full({2, 2}, 2.0)));
  }

  TEST_CASE(
      "detach and shallow copies work under active interceptors, inside and outside intercept()") {
    struct Detaching final : OpInterceptor {
      void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
        run_below(op, stack);
        if (op.schema().name() == "aten::mul") {
          const at::Tensor& out = stack->back().toTensor();
          at::Tensor d = out.detach();
          CHECK(d.data_ptr() == out.data_ptr());
          CHECK(out.variable_data().data_ptr() == out.data_ptr());
        }
      }
    } inner;
    Counter outer;
    torch::Tensor a = torch::ones({2, 2}, torch::requires_grad());
    {
      InterceptorScope o(outer);
      InterceptorScope i(inner);
      torch::Tensor y = a * 3;
      torch::Tensor d = y.detach();  // through the mode's interpreter
      CHECK(d.data_ptr() == y.data_ptr());
      CHECK_FALSE(d.requires_grad());
      CHECK(y.tensor_data().data_ptr() == y.data_ptr());
      y.sum().backward();  // saved variables are shallow copies too
    }
    CHECK(outer["aten::mul"] >= 1);
    CHECK(torch::equal(a.grad(), torch::full({2, 2}, 3.0)));
  }

  TEST_CASE("InternalOpsGuard hides ops from every interceptor; detach still works under it") {
    Counter outer, inner;
    torch::Tensor a = torch::ones({2, 2}, torch::requires_grad());
    {
      InterceptorScope o(outer);
      InterceptorScope i(inner);
      {
        recompose::detail::InternalOpsGuard internal;
        torch::Tensor y = torch::mm(a, a).clone();
        torch::Tensor d = y.detach();
        CHECK(d.data_ptr() == y.data_ptr());
        CHECK(y.requires_grad());  // autograd still records
      }
      (void)torch::mm(a, a);  // the guard is gone: seen again
    }
    CHECK(outer.seen == std::map<std::string, int>{{"aten::mm", 1}});
    CHECK(inner.seen == std::map<std::string, int>{{"aten::mm", 1}});
  }

}  // TEST_SUITE
