// OpTraits (lib/selective/op_traits.h): what selective checkpointing knows of an operator,
// computed once per operator, the same object for every thread, and forgotten when the
// operator's schema is deregistered.
#include "selective/op_traits.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <doctest/doctest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <string>
#include <thread>
#include <vector>

using recompose::detail::OpTraits;

namespace {

const OpTraits& traits_of(const char* name, const char* overload) {
  return OpTraits::of(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
}

}  // namespace

TEST_CASE("op traits: the facts of known operators") {
  CHECK(traits_of("aten::detach", "").ignored);
  CHECK(traits_of("aten::size", "int").ignored);
  CHECK(traits_of("aten::sym_numel", "").ignored);
  CHECK_FALSE(traits_of("aten::mm", "").ignored);

  const OpTraits& mm = traits_of("aten::mm", "");
  CHECK_FALSE(mm.returns_alias);
  CHECK_FALSE(mm.view);
  CHECK_FALSE(mm.writes_argument);
  CHECK_FALSE(mm.random);
  CHECK(mm.inplace_argument == -1);
  CHECK_FALSE(mm.carriable);

  const OpTraits& view = traits_of("aten::view", "");
  CHECK(view.returns_alias);
  CHECK(view.view);
  CHECK(view.returns_unwritten_alias);
  CHECK_FALSE(view.writes_argument);

  const OpTraits& add_ = traits_of("aten::add_", "Tensor");
  CHECK(add_.returns_alias);
  CHECK_FALSE(add_.view);
  CHECK_FALSE(add_.returns_unwritten_alias);
  CHECK(add_.writes_argument);
  REQUIRE(add_.written_arguments.size() == 1);
  CHECK(add_.written_arguments[0] == 0);
  CHECK(add_.inplace_argument == 0);
  CHECK(add_.carriable);

  const OpTraits& add_out = traits_of("aten::add", "out");  // out=: may resize, never carried
  CHECK(add_out.writes_argument);
  CHECK(add_out.inplace_argument == -1);
  CHECK_FALSE(add_out.carriable);
  CHECK(traits_of("aten::t_", "").inplace_argument == -1);  // inplace_view: a new layout
  CHECK(traits_of("aten::resize_", "").inplace_argument == -1);

  const OpTraits& bernoulli_ = traits_of("aten::bernoulli_", "float");
  CHECK(bernoulli_.random);
  CHECK(bernoulli_.draw);
  CHECK(bernoulli_.inplace_argument == 0);
  CHECK_FALSE(bernoulli_.carriable);  // a recomputation must draw as the forward drew
  CHECK(traits_of("aten::bernoulli_", "Tensor").draw);
  CHECK(traits_of("aten::bernoulli", "").random);
  CHECK_FALSE(traits_of("aten::bernoulli", "").draw);
  CHECK(traits_of("aten::randn", "").random);  // nondeterministic_seeded

  const OpTraits& rrelu = traits_of("aten::rrelu_with_noise", "");  // writes its noise beside
  CHECK(rrelu.writes_argument);
  CHECK(rrelu.writes(1));  // rrelu_with_noise(Tensor self, Tensor(a!) noise, ...)
  CHECK_FALSE(rrelu.writes(0));
  CHECK_FALSE(rrelu.returns_alias);
  CHECK(rrelu.random);

  CHECK(traits_of("aten::native_batch_norm", "").writes_undeclared);
  CHECK_FALSE(traits_of("aten::native_layer_norm", "").writes_undeclared);
  CHECK(traits_of("aten::_to_copy", "").to_copy);
  CHECK_FALSE(traits_of("aten::to", "dtype").to_copy);
  CHECK(traits_of("aten::_safe_softmax", "").cheaper_replay);
  CHECK_FALSE(traits_of("aten::_softmax", "").cheaper_replay);
}

TEST_CASE("op traits: the name's hash, one for every overload of a name") {
  const size_t add = std::hash<std::string>{}("aten::add");
  CHECK(traits_of("aten::add", "Tensor").name_hash == add);
  CHECK(traits_of("aten::add", "Scalar").name_hash == add);
  CHECK(traits_of("aten::add_", "Tensor").name_hash == std::hash<std::string>{}("aten::add_"));
  CHECK(traits_of("aten::mm", "").name_hash != add);
}

TEST_CASE("op traits: autocast's parameter casts are decided per call") {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "");
  const OpTraits& traits = OpTraits::of(op);
  auto cast = [&](const at::Tensor& t, at::ScalarType to) {
    // _to_copy(Tensor self, *, ScalarType? dtype, Layout? layout, Device? device,
    //          bool? pin_memory, bool non_blocking, MemoryFormat? memory_format)
    torch::jit::Stack stack{t,     to,           c10::IValue(), c10::IValue(), c10::IValue(),
                            false, c10::IValue()};
    return recompose::detail::autocast_cacheable_cast(traits, op, stack);
  };
  const at::Tensor param = torch::ones({2}).requires_grad_();
  CHECK(cast(param, at::kBFloat16));
  CHECK(cast(param, at::kHalf));
  CHECK_FALSE(cast(param, at::kDouble));
  CHECK_FALSE(cast(torch::ones({2}), at::kBFloat16));  // no grad
  CHECK_FALSE(cast(param * 2, at::kBFloat16));         // no leaf
}

TEST_CASE("op traits: one object per operator, for every thread") {
  std::vector<c10::OperatorHandle> ops;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (auto op = dispatcher.findSchema(name)) ops.push_back(*op);
  }
  REQUIRE(ops.size() > 1000);
  constexpr int kThreads = 4;
  std::vector<std::vector<const OpTraits*>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the operators in another order, so that they race on first sight.
      for (size_t i = 0; i < ops.size(); ++i) {
        seen[t].push_back(&OpTraits::of(ops[(i * (t + 1)) % ops.size()]));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (size_t i = 0; i < ops.size(); ++i) {
      REQUIRE(seen[t][i] == &OpTraits::of(ops[(i * (t + 1)) % ops.size()]));
    }
  }
}

TEST_CASE("op traits: an operator deregistered and defined again gets its new traits") {
  auto traits_of_probe = [] {
    return OpTraits::of(
        c10::Dispatcher::singleton().findSchemaOrThrow("recompose_op_traits_test::probe_", ""));
  };
  {
    torch::Library lib(torch::Library::FRAGMENT, "recompose_op_traits_test", std::nullopt, __FILE__,
                       __LINE__);
    lib.def("probe_(Tensor(a!) self) -> Tensor(a!)");
    const OpTraits t = traits_of_probe();
    CHECK(t.returns_alias);
    CHECK(t.inplace_argument == 0);
  }
  torch::Library lib(torch::Library::FRAGMENT, "recompose_op_traits_test", std::nullopt, __FILE__,
                     __LINE__);
  lib.def("probe_(Tensor self) -> Tensor");
  const OpTraits t = traits_of_probe();
  CHECK_FALSE(t.returns_alias);
  CHECK(t.inplace_argument == -1);
}
