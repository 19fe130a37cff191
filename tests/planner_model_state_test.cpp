// profile_memory / plan_memory leave the model as they found it (recompose/memory_profile.h):
// parameters, buffers, .grad, train/eval modes, generators, hooks and attached state; the
// training that follows is bitwise the training of a model that was never profiled.
#include <recompose/recompose.h>

#include <ATen/CPUGeneratorImpl.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

using recompose::Budget;

namespace {

// Linear, BatchNorm (running statistics and a step counter as buffers), ReLU, dropout.
struct BnBlockImpl : torch::nn::Module {
  explicit BnBlockImpl(int64_t w) {
    fc = register_module("fc", torch::nn::Linear(w, w));
    bn = register_module("bn", torch::nn::BatchNorm1d(w));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return x + drop(torch::relu(bn(fc(x))));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(BnBlock);

struct BnNetImpl : torch::nn::Module {
  explicit BnNetImpl(int64_t w) {
    list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) {
      blocks.emplace_back(w);
      list->push_back(blocks.back());
    }
    head = register_module("head", torch::nn::Linear(w, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return head(x);
  }
  torch::nn::ModuleList list{nullptr};
  std::vector<BnBlock> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BnNet);

constexpr int64_t kWidth = 16;

BnNet make_net() {
  torch::manual_seed(3);
  return BnNet(kWidth);
}

torch::Tensor batch(int step) {
  torch::manual_seed(1000 + step);
  return torch::randn({8, kWidth});
}

torch::Tensor loss_of(BnNet& net, const torch::Tensor& x) { return net(x).pow(2).mean(); }

// Everything profiling must leave as it was, copied; and the tensors themselves, for identity.
struct ModelState {
  std::vector<torch::Tensor> values;    // parameters, buffers, grads (undefined where none)
  std::vector<const void*> identities;  // their TensorImpls
  std::vector<bool> modes;
  torch::Tensor cpu_generator;
  size_t hooks = 0;
  std::vector<std::vector<std::string>> apis;
};

ModelState state_of(BnNet& net) {
  ModelState s;
  auto add = [&](const torch::Tensor& t) {
    s.values.push_back(t.defined() ? t.detach().clone() : torch::Tensor());
    s.identities.push_back(t.defined() ? static_cast<const void*>(t.unsafeGetTensorImpl())
                                       : nullptr);
  };
  for (const auto& p : net->parameters()) add(p), add(p.grad());
  for (const auto& b : net->buffers()) add(b);
  s.modes.push_back(net->is_training());
  for (const auto& m : net->modules(/*include_self=*/false)) s.modes.push_back(m->is_training());
  s.cpu_generator = at::detail::getDefaultCPUGenerator().get_state();
  for (auto& b : net->blocks) {
    s.hooks += recompose::hooks::hook_count(*b);
    s.apis.push_back(recompose::hooks::applied_apis(*b));
  }
  return s;
}

void check_same(const ModelState& a, const ModelState& b) {
  REQUIRE(a.values.size() == b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    CAPTURE(i);
    CHECK(a.identities[i] == b.identities[i]);
    REQUIRE(a.values[i].defined() == b.values[i].defined());
    if (a.values[i].defined()) CHECK(torch::equal(a.values[i], b.values[i]));
  }
  CHECK(a.modes == b.modes);
  CHECK(torch::equal(a.cpu_generator, b.cpu_generator));
  CHECK(a.hooks == b.hooks);
  CHECK(a.apis == b.apis);
}

struct UserState {};

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE(
      "planner: profile_memory and plan_memory leave buffers, .grad, modes, generators and hooks "
      "as they were") {
    // Before profiling: 0 no gradients yet, all in training mode; 1 gradients from an earlier
    // backward, one block in eval mode; 2 a gradient on one parameter only, all in eval mode but
    // one block.
    for (int before_kind = 0; before_kind < 3; ++before_kind) {
      // The step: 0 forward and backward (plan_memory); 1 zero_grad (.grad set to none, backward
      // makes new tensors), train(), an optimizer step (plan_memory); 2 profile_memory alone;
      // 3 a step that throws in the second run.
      for (int step_kind = 0; step_kind < 4; ++step_kind) {
        CAPTURE(before_kind);
        CAPTURE(step_kind);
        BnNet net = make_net();
        auto x = batch(0);
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        // A user's own hook and attached state stay; what the profiler attaches goes.
        int user_hook_calls = 0;
        auto user_hook = recompose::hooks::register_forward_hook(*net->blocks[0],
                                                                 [&](auto&) { ++user_hook_calls; });
        recompose::hooks::attach_state(*net->blocks[2], "user.api", std::make_shared<UserState>());
        if (before_kind == 1) {
          loss_of(net, batch(7)).backward();
          net->blocks[1]->eval();
        } else if (before_kind == 2) {
          net->blocks[0]->fc->weight.mutable_grad() =
              torch::full_like(net->blocks[0]->fc->weight, 0.25);
          net->eval();
          net->blocks[2]->train();
        }
        const ModelState before = state_of(net);
        const int64_t tracked = net->blocks[0]->bn->num_batches_tracked.item<int64_t>();

        if (step_kind == 0) {
          (void)recompose::plan_memory(
              *net, [&] { loss_of(net, x).backward(); }, Budget::parse("50%"));
        } else if (step_kind == 1) {
          (void)recompose::plan_memory(
              *net,
              [&] {
                net->train();
                sgd.zero_grad();
                loss_of(net, x).backward();
                sgd.step();
              },
              Budget::parse("50%"));
        } else if (step_kind == 2) {
          (void)recompose::profile_memory(*net, [&] { loss_of(net, x).backward(); });
        } else {
          int runs = 0;
          auto step = [&] {
            loss_of(net, x).backward();
            if (++runs == 2) throw std::runtime_error("user error in the step");
          };
          CHECK_THROWS_WITH_AS(recompose::profile_memory(*net, step), "user error in the step",
                               std::runtime_error);
          CHECK(runs == 2);
        }
        check_same(before, state_of(net));
        CHECK(net->blocks[0]->bn->num_batches_tracked.item<int64_t>() == tracked);
        CHECK(user_hook_calls > 0);  // the user's hook ran during profiling, and is still there
        for (auto& b : net->blocks) CHECK(!recompose::is_checkpointed(b));
        user_hook.remove();
      }
    }
  }

  TEST_CASE(
      "planner: after profiling and planning, training is bitwise the training of a model never "
      "profiled") {
    constexpr int kSteps = 8;
    std::vector<torch::Tensor> inputs;
    for (int s = 0; s <= kSteps; ++s) inputs.push_back(batch(s));
    // From the same generator state: dropout draws from the CPU generator in every step.
    auto train = [&](BnNet& net, const recompose::Plan* plan) {
      torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      if (plan) recompose::apply_plan(*net, *plan);
      std::vector<torch::Tensor> record;
      for (int s = 0; s < kSteps; ++s) {
        sgd.zero_grad();
        auto loss = loss_of(net, inputs[static_cast<size_t>(s)]);
        loss.backward();
        sgd.step();
        record.push_back(loss.detach());
      }
      if (plan) recompose::remove_plan(*net, *plan);
      for (const auto& p : net->parameters()) record.push_back(p.detach().clone());
      for (const auto& b : net->buffers()) record.push_back(b.clone());
      net->eval();
      torch::NoGradGuard no_grad;
      record.push_back(net(inputs.back()));
      return record;
    };
    auto bitwise = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!torch::equal(a[i], b[i])) return false;
      }
      return true;
    };

    BnNet plain = make_net();
    torch::manual_seed(42);
    const auto expected = train(plain, nullptr);

    for (bool apply : {false, true}) {
      CAPTURE(apply);
      BnNet net = make_net();
      torch::manual_seed(42);
      const recompose::Plan plan = recompose::plan_memory(
          *net, [&] { loss_of(net, inputs[0]).backward(); }, Budget::parse("40%"));
      if (apply) {
        bool checkpointed = false;
        for (const auto& m : plan.modules)
          checkpointed = checkpointed || m.choice != recompose::ModuleChoice::None;
        CHECK(checkpointed);
      }
      CHECK(bitwise(expected, train(net, apply ? &plan : nullptr)));
    }
  }

}  // TEST_SUITE
