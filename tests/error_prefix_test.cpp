// Every error recompose raises starts with one prefix, "recompose: ", then the API that raised
// it where one did (docs/architecture.md, "Errors"): a log line is attributed at a glance, and a
// caller can tell recompose's errors from LibTorch's by their text too.
#include <recompose/recompose.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include "engine/cpu_generator_adapter.h"

#include <functional>
#include <string>

namespace {

// The message of the exception of type E that `fn` throws ("" if it throws none).
template <class E>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

void check_prefix(const std::string& message, const std::string& prefix) {
  INFO("message: " << message);
  CHECK(message.rfind(prefix, 0) == 0);
}

}  // namespace

TEST_SUITE("error prefix") {
  TEST_CASE("engine and front-end errors start with 'recompose: '") {
    check_prefix(message_of<recompose::CheckpointError>([] {
                   recompose::GraphExecGroup outer;
                   recompose::GraphExecGroup inner;
                 }),
                 "recompose: GraphExecGroup: groups cannot be nested");
    torch::nn::Sequential seq(torch::nn::Linear(2, 2));
    check_prefix(message_of<std::invalid_argument>([&] {
                   recompose::checkpoint_sequential(seq, 0, torch::ones({1, 2}));
                 }),
                 "recompose: checkpoint_sequential: segments must be");
  }

  TEST_CASE("the CPU generator adapter raises a CheckpointError, not a c10::Error") {
    // It used TORCH_CHECK, outside the documented error policy.
    CHECK_THROWS_AS(recompose::detail::read_cpu_generator(at::Generator()),
                    recompose::CheckpointError);
    check_prefix(message_of<recompose::CheckpointError>(
                     [] { recompose::detail::read_cpu_generator(at::Generator()); }),
                 "recompose: ");
  }

#ifndef RECOMPOSE_TEST_NO_SWAP
  TEST_CASE("swap errors start with 'recompose: '") {
    check_prefix(message_of<std::invalid_argument>([] {
                   recompose::SwapManager::create(recompose::SwapOptions().min_bytes(-1));
                 }),
                 "recompose: SwapOptions: min_bytes");
    auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    check_prefix(message_of<recompose::CheckpointError>([&] { manager->end_group(99); }),
                 "recompose: SwapManager::end_group(99)");
    auto swapped = manager->offload(torch::ones({4}));
    swapped->release();
    check_prefix(message_of<recompose::CheckpointError>([&] { swapped->get(); }),
                 "recompose: SwappedTensor::get");
    torch::nn::Linear plain(2, 2);
    check_prefix(message_of<recompose::CheckpointError>([&] { recompose::offload_stats(*plain); }),
                 "recompose: offload_stats: ");
    // The version check LibTorch skips when hooks are set, done by swap's hooks.
    torch::Tensor x = torch::ones({4}, torch::requires_grad());
    torch::Tensor loss;
    {
      recompose::AsyncSaveOnCpu offload(manager);
      torch::Tensor y = x * 2;
      torch::Tensor z = y.sin();
      y.add_(1);
      loss = z.sum();
    }
    check_prefix(message_of<recompose::CheckpointError>([&] { loss.backward(); }),
                 "recompose: one of the variables needed for gradient computation");
  }
#endif

#ifndef RECOMPOSE_TEST_NO_SELECTIVE
  TEST_CASE("selective checkpointing errors start with 'recompose: '") {
    check_prefix(message_of<std::invalid_argument>(
                     [] { recompose::SelectivePolicy({"aten::no_such_op_anywhere"}); }),
                 "recompose: selective checkpoint: unknown op");
    check_prefix(message_of<std::invalid_argument>(
                     [] { recompose::SelectivePolicy(recompose::PolicyFn{}); }),
                 "recompose: SelectivePolicy: the policy function is empty");
  }
#endif
#if !defined(RECOMPOSE_TEST_NO_SELECTIVE) && !defined(RECOMPOSE_TEST_NO_SWAP)
  TEST_CASE("planner errors start with 'recompose: ', file errors are CheckpointErrors") {
    check_prefix(message_of<std::invalid_argument>([] { recompose::Budget::parse("lots"); }),
                 "recompose: Budget::parse");
    check_prefix(message_of<std::invalid_argument>([] { recompose::Plan::from_json("{}"); }),
                 "recompose: Plan::from_json");
    check_prefix(
        message_of<std::invalid_argument>([] { recompose::MemoryProfile::from_json("{}"); }),
        "recompose: MemoryProfile::from_json");
    check_prefix(message_of<recompose::CheckpointError>(
                     [] { recompose::Plan::load("/nonexistent-folder-of-recompose/plan.json"); }),
                 "recompose: cannot read");
    check_prefix(message_of<std::invalid_argument>([] {
                   recompose::solve_plan(recompose::MemoryProfile{},
                                         recompose::Budget::parse("50%"));
                 }),
                 "recompose: solve_plan");
  }
#endif
}
