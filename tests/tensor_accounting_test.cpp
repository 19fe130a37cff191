// Tensor accounting (lib/engine/tensor_accounting.h): one rule for the bytes of an op's outputs
// and of a module's inputs, for the planner's profiler and inspect_policy alike.
#include "engine/tensor_accounting.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <vector>

using recompose::detail::distinct_storage_bytes;

TEST_CASE("distinct storage bytes: each storage once, parameters left out where asked") {
  const at::Tensor a = torch::zeros({4, 8});  // 128 bytes
  const at::Tensor b = torch::zeros({16});    // 64 bytes
  const at::Tensor view = a.narrow(0, 1, 2);  // a's storage again
  const std::vector<c10::IValue> values{a, view, c10::List<at::Tensor>({b, a})};
  CHECK(distinct_storage_bytes(values, /*skip_parameter_like=*/false) == 128 + 64);

  const at::Tensor weight = torch::zeros({8, 8}, torch::requires_grad());  // 256 bytes
  const std::vector<c10::IValue> with_weight{weight.t(), b};
  CHECK(distinct_storage_bytes(with_weight, /*skip_parameter_like=*/false) == 256 + 64);
  CHECK(distinct_storage_bytes(with_weight, /*skip_parameter_like=*/true) == 64);
  CHECK(distinct_storage_bytes({c10::IValue(), at::Tensor()}, false) == 0);
}

TEST_CASE("an op's printed name: name.overload, default for the unnamed overload") {
  auto& dispatcher = c10::Dispatcher::singleton();
  CHECK(recompose::detail::overload_name(dispatcher.findSchemaOrThrow("aten::mm", "")) ==
        "aten::mm.default");
  CHECK(recompose::detail::overload_name(dispatcher.findSchemaOrThrow("aten::max", "dim")) ==
        "aten::max.dim");
}
