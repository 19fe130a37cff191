// apply_checkpoint_to<M> / apply_offload_to<M>: every module of a type, anywhere in a model's
// tree (private members included), in one line.
#include "support/grad_check.h"
#include "support/test_modules.h"

#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

using recompose::CheckpointOptions;

namespace {

// A model as users write them: its blocks sit in a private Sequential (a CIFAR ResNet's stages),
// one more block nested inside a private ModuleList, and a head that is no block.
class HiddenBlocksImpl : public torch::nn::Module {
 public:
  explicit HiddenBlocksImpl(int64_t width = 8) {
    stages_ = register_module(
        "stages",
        torch::nn::Sequential(rt::TinyBlock(width), rt::TinyBlock(width), rt::TinyBlock(width)));
    extra_ = register_module("extra", torch::nn::ModuleList(rt::TinyBlock(width)));
    head_ = register_module("head", torch::nn::Linear(width, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = stages_->forward(x);
    x = extra_[0]->as<rt::TinyBlockImpl>()->forward(x) + x;
    return head_->forward(x);
  }
  std::vector<rt::TinyBlockImpl*> blocks() const {
    std::vector<rt::TinyBlockImpl*> out;
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* b = dynamic_cast<rt::TinyBlockImpl*>(m.get())) out.push_back(b);
    }
    return out;
  }

 private:
  torch::nn::Sequential stages_{nullptr};
  torch::nn::ModuleList extra_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(HiddenBlocks);

HiddenBlocks make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return HiddenBlocks();
}

}  // namespace

TEST_SUITE_BEGIN("apply_to");

TEST_CASE(
    "apply_checkpoint_to: every block of a type in private members, in one line, bitwise as "
    "without") {
  HiddenBlocks plain = make_model(3), model = make_model(3);
  torch::Tensor x = torch::randn({4, 8});
  CHECK(recompose::apply_checkpoint_to<rt::TinyBlockImpl>(*model) == 4);
  for (auto* b : model->blocks()) CHECK(recompose::is_checkpointed(*b));
  for (const auto& m : model->modules(/*include_self=*/true)) {
    if (!dynamic_cast<rt::TinyBlockImpl*>(m.get())) CHECK_FALSE(recompose::is_checkpointed(*m));
  }
  auto g_plain = rt::grads_of([&] { return plain(x).pow(2).sum(); }, plain->parameters());
  auto g_model = rt::grads_of([&] { return model(x).pow(2).sum(); }, model->parameters());
  CHECK(rt::bitwise_equal(g_plain, g_model));
  for (auto* b : model->blocks()) CHECK(b->body_runs == 2);  // forward and recomputation
  for (auto* b : model->blocks()) CHECK(recompose::remove_checkpoint(*b));
}

TEST_CASE(
    "apply_checkpoint_to: the holder type works as the module type; options reach every block") {
  HiddenBlocks model = make_model(4);
  CHECK(recompose::apply_checkpoint_to<rt::TinyBlock>(model,
                                                      CheckpointOptions().early_stop(false)) == 4);
  for (auto* b : model->blocks()) CHECK(recompose::is_checkpointed(*b));
  model(torch::randn({2, 8})).sum().backward();
  for (auto* b : model->blocks()) CHECK(b->body_runs == 2);
}

TEST_CASE("apply_checkpoint_to: no module of the type is an error, not a silent no-op") {
  HiddenBlocks model = make_model(5);
  CHECK_THROWS_WITH_AS(recompose::apply_checkpoint_to<rt::MixedArgsImpl>(*model),
                       doctest::Contains("no module of type rt::MixedArgsImpl"),
                       std::invalid_argument);
  for (const auto& m : model->modules()) CHECK(recompose::hooks::applied_apis(*m).empty());
}

TEST_CASE("apply_checkpoint_to: all or nothing when one block cannot be checkpointed") {
  HiddenBlocks model = make_model(6);
  auto blocks = model->blocks();
  recompose::apply_checkpoint(*blocks[2]);  // already checkpointed: applying again is refused
  CHECK_THROWS_AS(recompose::apply_checkpoint_to<rt::TinyBlockImpl>(*model),
                  recompose::hooks::CompositionError);
  CHECK_FALSE(recompose::is_checkpointed(*blocks[0]));
  CHECK_FALSE(recompose::is_checkpointed(*blocks[1]));
  CHECK(recompose::is_checkpointed(*blocks[2]));  // the user's own application is left alone
  CHECK_FALSE(recompose::is_checkpointed(*blocks[3]));
  // Bad options are refused before anything is attached.
  CHECK(recompose::remove_checkpoint(*blocks[2]));
  auto bad =
      CheckpointOptions().context_fn([] { return std::shared_ptr<recompose::RegionContexts>(); });
#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  bad.policy(recompose::SelectivePolicy({"aten::mm"}));
  CHECK_THROWS_AS(recompose::apply_checkpoint_to<rt::TinyBlockImpl>(*model, bad),
                  recompose::CheckpointError);
  for (auto* b : blocks) CHECK_FALSE(recompose::is_checkpointed(*b));
#endif
}

#ifndef RECOMPOSE_TEST_NO_SWAP
TEST_CASE("apply_offload_to: every block of a type in private members, bitwise as without") {
  HiddenBlocks plain = make_model(7), model = make_model(7);
  torch::Tensor x = torch::randn({4, 8});
  auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
  CHECK(recompose::apply_offload_to<rt::TinyBlockImpl>(
            *model, recompose::OffloadOptions().manager(manager)) == 4);
  for (auto* b : model->blocks()) CHECK(recompose::is_offloaded(*b));
  auto g_plain = rt::grads_of([&] { return plain(x).pow(2).sum(); }, plain->parameters());
  auto g_model = rt::grads_of([&] { return model(x).pow(2).sum(); }, model->parameters());
  CHECK(rt::bitwise_equal(g_plain, g_model));
  CHECK(recompose::offload_stats(*model->blocks()[0]).tensors_offloaded > 0);
  CHECK_THROWS_AS(recompose::apply_offload_to<rt::MixedArgsImpl>(*model), std::invalid_argument);
}
#endif

TEST_SUITE_END();
