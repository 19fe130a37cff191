// A forward trace reserves the sizes the last trace reached (Note [ A trace reserves the last one's
// sizes ], lib/selective/forward_trace.cpp): recording a region's ops then moves no record, and
// the guess never limits a trace or makes one hold what another region needed.
#include "selective/forward_trace.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <vector>

using recompose::detail::ForwardTrace;
using recompose::detail::OpTraits;

namespace {

// Records `ops` chained adds below autograd, as the forward's interceptor does; `after_each`, if
// given, runs after each op is recorded.
void record_adds(ForwardTrace& trace, int ops, const std::function<void()>& after_each = {}) {
  const c10::OperatorHandle add =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  at::Tensor x = torch::ones({4});
  trace.add_inputs({x});
  for (int i = 0; i < ops; ++i) {
    torch::jit::Stack stack{x, x, c10::Scalar(1)};
    trace.begin(add, OpTraits::of(add), stack);
    {
      at::AutoDispatchBelowAutograd below;
      add.callBoxed(&stack);
    }
    trace.end(stack, nullptr, nullptr);
    x = stack.front().toTensor();
    if (after_each) after_each();
  }
}

// The trace's arrays' addresses after each op: unchanged while no array grew.
struct ArrayAddresses {
  const void* nodes;
  const void* storages;
  bool operator==(const ArrayAddresses&) const = default;
};
ArrayAddresses addresses_of(const ForwardTrace& t) {
  return {t.nodes().data(), t.storages().data()};
}

}  // namespace

TEST_CASE("forward trace: a region like the last one records its ops without moving a record") {
  {
    ForwardTrace first;
    record_adds(first, 300);
  }  // leaves its sizes
  ForwardTrace second;
  std::vector<ArrayAddresses> seen;
  record_adds(second, 300, [&] { seen.push_back(addresses_of(second)); });
  CHECK(seen.size() == 300);
  CHECK(second.nodes().size() == 300);
  CHECK(second.nodes().capacity() >= 300);
  // Reserved at the first op: no array moved for the 299 ops after it.
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] == seen.front());
}

TEST_CASE("forward trace: the reserve is a guess, not a limit, and capped") {
  {
    ForwardTrace small;
    record_adds(small, 10);
  }
  ForwardTrace larger;
  record_adds(larger, 50);  // grows past the guess
  CHECK(larger.nodes().size() == 50);
  CHECK(larger.storages().size() == 51);  // the input and one storage per add

  // A region of 20,000 ops, then one op: the one-op region does not reserve 20,000 nodes.
  {
    ForwardTrace huge;
    record_adds(huge, 20000);
  }
  ForwardTrace tiny;
  record_adds(tiny, 1);
  CHECK(tiny.nodes().size() == 1);
  CHECK(tiny.nodes().capacity() <= std::size_t{1} << 14);
  CHECK(tiny.nodes().capacity() >= 1);
}

TEST_CASE("forward trace: a trace that recorded no op leaves the last sizes as they were") {
  {
    ForwardTrace sized;
    record_adds(sized, 120);
  }
  { ForwardTrace empty; }  // a region that ran no intercepted op
  ForwardTrace next;
  record_adds(next, 1);
  CHECK(next.nodes().capacity() >= 120);
}
