// The GraphExecGroup tests' region: two outputs whose backward calls need disjoint saved tensors.
#pragma once

#include <recompose/checkpoint.h>
#include <recompose/graph_exec_group.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <tuple>

namespace rt {

// sin saves x * 2, cos saves x * 3 (a product by a scalar saves nothing). Counts its runs.
struct TwoHeads {
  int runs = 0;
  std::tuple<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& x) {
    ++runs;
    return {(x * 2).sin(), (x * 3).cos()};
  }
};

// Checkpoints TwoHeads on `x` (a leaf requiring grad, on any device) and runs one backward call
// per head, without and with a GraphExecGroup around them: without a group each call recomputes
// the region, with one only the first does; the gradient is bitwise the plain one either way.
inline void check_backward_calls_share_one_recomputation(const torch::Tensor& x) {
  TwoHeads plain;
  auto [pa, pb] = plain(x);
  pa.sum().backward();
  pb.sum().backward();
  const auto expected = x.grad().clone();

  for (bool grouped : {false, true}) {
    CAPTURE(grouped);
    x.mutable_grad() = torch::Tensor();
    auto heads = std::make_shared<TwoHeads>();
    auto [a, b] =
        recompose::checkpoint([heads](const torch::Tensor& in) { return (*heads)(in); }, x);
    CHECK(heads->runs == 1);
    {
      std::optional<recompose::GraphExecGroup> group;
      if (grouped) group.emplace();
      a.sum().backward();
      b.sum().backward();
    }
    CHECK(heads->runs == (grouped ? 2 : 3));
    CHECK(torch::equal(x.grad(), expected));
  }
}

}  // namespace rt
