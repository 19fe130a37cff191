// GraphExecGroup (recompose/graph_exec_group.h): several backward calls share one recomputation.
#include "support/two_heads.h"

#include <recompose/checkpoint.h>
#include <recompose/graph_exec_group.h>
#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <thread>
#include <tuple>

namespace {

using rt::TwoHeads;

struct TwoHeadsModuleImpl : torch::nn::Module {
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return heads(x);
  }
  TwoHeads heads;
};
TORCH_MODULE(TwoHeadsModule);

}  // namespace

TEST_SUITE_BEGIN("graph_exec_group");

TEST_CASE("GraphExecGroup: two backward calls share one recomputation") {
  rt::check_backward_calls_share_one_recomputation(torch::randn({5}, torch::requires_grad()));
}

TEST_CASE("GraphExecGroup: with apply_checkpoint, and again after the group closed") {
  TwoHeadsModule module;
  recompose::apply_checkpoint(module);
  auto x = torch::randn({5}, torch::requires_grad());
  auto [a, b] = module(x);
  auto [c, d] = module(x);
  {
    recompose::GraphExecGroup group;
    a.sum().backward();
    b.sum().backward();
  }
  CHECK(module->heads.runs == 3);  // two forwards, one shared recomputation
  // Outside the group, each call recomputes what it needs again.
  c.sum().backward();
  d.sum().backward();
  CHECK(module->heads.runs == 5);
}

TEST_CASE("GraphExecGroup: overlapping backward calls, nesting and other threads") {
  auto heads = std::make_shared<TwoHeads>();
  auto x = torch::randn({5}, torch::requires_grad());
  auto [a, b] = recompose::checkpoint([heads](const torch::Tensor& in) { return (*heads)(in); }, x);
  {
    recompose::GraphExecGroup group;
    CHECK_THROWS_AS(recompose::GraphExecGroup(), recompose::CheckpointError);
    a.sum().backward({}, /*retain_graph=*/true);
    // The same saved tensor a second time under the group: a clear error, not a silent reuse.
    CHECK_THROWS_WITH_AS(a.sum().backward(), doctest::Contains("GraphExecGroup"),
                         recompose::CheckpointError);
    // A backward made on another thread is not in this thread's group: it recomputes.
    const int before = heads->runs;
    std::thread([&] { b.sum().backward(); }).join();
    CHECK(heads->runs == before + 1);
  }
  // Groups can be opened again once closed.
  recompose::GraphExecGroup again;
  CHECK(again.key() < 0);
}

TEST_SUITE_END();
