// Batch norm under the selective replay (Note [ Batch norm replayed with stand-in running
// statistics ], lib/selective/batch_norm_replay.h): the replay runs native_batch_norm with other
// running statistics than the forward's, and must still compute what the forward computed, bit for
// bit, in every dtype autocast gives it, every layout, with or without affine parameters and
// running statistics, in training and in eval.
#include "selective/batch_norm_replay.h"
#include "support/selective_helpers.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/policy_report.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace {

using recompose::CheckpointOptions;
using recompose::SelectivePolicy;

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (!a[i].defined()) continue;
    if (a[i].scalar_type() != b[i].scalar_type() || a[i].sizes() != b[i].sizes() ||
        a[i].strides() != b[i].strides() || !torch::equal(a[i], b[i]))
      return false;
  }
  return true;
}

// CPU autocast in `dtype` while alive (kFloat: off); puts back what it found, clears the cache.
struct CpuAutocast {
  bool was_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  at::ScalarType was_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  explicit CpuAutocast(at::ScalarType dtype) {
    at::autocast::set_autocast_enabled(at::kCPU, dtype != at::kFloat);
    if (dtype != at::kFloat) at::autocast::set_autocast_dtype(at::kCPU, dtype);
  }
  ~CpuAutocast() {
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype);
    at::autocast::clear_cache();
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;
};

// The low-precision dtypes this CPU's autocast runs a convolution in (fp16 where supported).
std::vector<at::ScalarType> autocast_dtypes() {
  std::vector<at::ScalarType> out = {at::kBFloat16};
  try {
    CpuAutocast on(at::kHalf);
    (void)torch::conv1d(torch::ones({1, 2, 3}), torch::ones({2, 2, 1}));
    (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
    out.push_back(at::kHalf);
  } catch (const c10::Error&) {
  }
  return out;
}

const char* name_of(at::ScalarType t) { return t == at::kFloat ? "off" : c10::toString(t); }

// What a batch norm sees: a projection (Linear on [N, C], ConvNd otherwise) in front of it, so
// that autocast hands it a low-precision input, then ReLU and a second projection.
struct BnBlockImpl : torch::nn::Module {
  BnBlockImpl(int dims, bool affine, bool track) : dims(dims) {
    const int64_t c = 6;
    if (dims == 0) {
      proj = register_module("proj", torch::nn::Linear(c, c));
      out = register_module("out", torch::nn::Linear(c, c));
    } else {
      auto conv = [&](const char* name) -> std::shared_ptr<torch::nn::Module> {
        if (dims == 1)
          return register_module(name,
                                 torch::nn::Conv1d(torch::nn::Conv1dOptions(c, c, 3).padding(1)));
        if (dims == 2)
          return register_module(name,
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)));
        return register_module(name,
                               torch::nn::Conv3d(torch::nn::Conv3dOptions(c, c, 3).padding(1)));
      };
      proj_conv = conv("proj");
      out_conv = conv("out");
    }
    if (dims <= 1) {
      bn = register_module(
          "bn", torch::nn::BatchNorm1d(
                    torch::nn::BatchNorm1dOptions(c).affine(affine).track_running_stats(track)));
    } else if (dims == 2) {
      bn = register_module(
          "bn", torch::nn::BatchNorm2d(
                    torch::nn::BatchNorm2dOptions(c).affine(affine).track_running_stats(track)));
    } else {
      bn = register_module(
          "bn", torch::nn::BatchNorm3d(
                    torch::nn::BatchNorm3dOptions(c).affine(affine).track_running_stats(track)));
    }
  }
  torch::Tensor project(const std::shared_ptr<torch::nn::Module>& conv, torch::nn::Linear& lin,
                        const torch::Tensor& x) {
    if (dims == 0) return lin(x);
    if (dims == 1) return std::static_pointer_cast<torch::nn::Conv1dImpl>(conv)->forward(x);
    if (dims == 2) return std::static_pointer_cast<torch::nn::Conv2dImpl>(conv)->forward(x);
    return std::static_pointer_cast<torch::nn::Conv3dImpl>(conv)->forward(x);
  }
  torch::Tensor normalize(const torch::Tensor& x) {
    if (dims <= 1) return std::static_pointer_cast<torch::nn::BatchNorm1dImpl>(bn)->forward(x);
    if (dims == 2) return std::static_pointer_cast<torch::nn::BatchNorm2dImpl>(bn)->forward(x);
    return std::static_pointer_cast<torch::nn::BatchNorm3dImpl>(bn)->forward(x);
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    torch::Tensor h = torch::relu(normalize(project(proj_conv, proj, x)));
    return x + project(out_conv, out, h);
  }
  int dims;
  torch::nn::Linear proj{nullptr}, out{nullptr};
  std::shared_ptr<torch::nn::Module> proj_conv, out_conv, bn;
};
TORCH_MODULE(BnBlock);

struct BnCase {
  int dims = 0;  // 0: Linear on [N, C]; 1, 2, 3: ConvNd and BatchNormNd
  bool affine = true, track = true, train = true, channels_last = false;
  at::ScalarType autocast = at::kFloat;
};

std::string str(const BnCase& c) {
  return "dims=" + std::to_string(c.dims) + " affine=" + std::to_string(c.affine) +
         " track=" + std::to_string(c.track) + " train=" + std::to_string(c.train) +
         " channels_last=" + std::to_string(c.channels_last) + " autocast=" + name_of(c.autocast);
}

torch::Tensor input_of(const BnCase& c) {
  std::vector<int64_t> sizes = {4, 6};
  for (int d = 0; d < c.dims; ++d) sizes.push_back(d == 0 ? 5 : 4);
  torch::Tensor x = torch::randn(sizes);
  if (c.channels_last && c.dims == 2) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  if (c.channels_last && c.dims == 3) x = x.contiguous(at::MemoryFormat::ChannelsLast3d);
  return x.requires_grad_(true);
}

// Two SGD-free steps (forward, backward) of the block from the same seed; with `policy`, as a
// selective region. Returns output, gradients and buffers after the steps.
std::vector<torch::Tensor> steps(const BnCase& c, const std::optional<SelectivePolicy>& policy) {
  torch::manual_seed(3);
  BnBlock block(c.dims, c.affine, c.track);
  block->train(c.train);
  if (policy) recompose::apply_checkpoint(block, CheckpointOptions().policy(*policy));
  std::vector<torch::Tensor> out;
  for (int step = 0; step < 2; ++step) {
    torch::Tensor x = input_of(c);
    torch::Tensor y;
    {
      CpuAutocast autocast(c.autocast);
      y = block(x);
    }
    y.to(torch::kFloat).square().sum().backward();
    out.push_back(y.detach());
    out.push_back(x.grad());
  }
  for (const auto& p : block->parameters()) out.push_back(p.grad());
  for (const auto& b : block->buffers()) out.push_back(b.clone());
  return out;
}

std::vector<BnCase> all_cases() {
  std::vector<BnCase> out;
  for (const at::ScalarType dtype : autocast_dtypes())
    for (int dims = 0; dims <= 3; ++dims)
      for (const bool affine : {false, true})
        for (const bool track : {false, true})
          for (const bool train : {true, false})
            for (const bool channels_last : {false, true}) {
              if (channels_last && dims < 2) continue;
              out.push_back(BnCase{dims, affine, track, train, channels_last, dtype});
            }
  out.push_back(BnCase{0, false, true, true, false, at::kFloat});
  out.push_back(BnCase{2, false, true, true, true, at::kFloat});
  return out;
}

// An op that gives another layout at every call after the first: `strides` (the same values,
// transposed strides), `sizes` (its first row only). A kernel reading state beside its arguments,
// as a user's op may; below autograd (no input of it requires grad).
std::atomic<int> g_flaky_calls{0};
at::Tensor flaky_strides(const at::Tensor& x) {
  if (++g_flaky_calls == 1) return x.clone();
  return x.t().contiguous().t();
}
at::Tensor flaky_sizes(const at::Tensor& x) {
  if (++g_flaky_calls == 1) return x.clone();
  return x.narrow(0, 0, 1).clone();
}
TORCH_LIBRARY(recompose_replay_test, m) {
  m.def("flaky_strides(Tensor x) -> Tensor");
  m.def("flaky_sizes(Tensor x) -> Tensor");
  m.impl("flaky_strides", c10::DispatchKey::CPU, TORCH_FN(flaky_strides));
  m.impl("flaky_sizes", c10::DispatchKey::CPU, TORCH_FN(flaky_sizes));
}

at::Tensor call_flaky(const char* name, const at::Tensor& x) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .typed<at::Tensor(const at::Tensor&)>()
      .call(x);
}

// x -> sin(flaky(2 x) * w) + x, keeping the products: the replay hands out the kept 2 x, then
// runs flaky again for the tensor the product saved for w's gradient.
std::vector<torch::Tensor> flaky_step(const char* op, bool checkpointed) {
  g_flaky_calls = 0;
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  torch::Tensor w = torch::randn({3, 4}, torch::requires_grad());
  auto body = [&](const torch::Tensor& in) {
    return (call_flaky(op, in.detach() * 2) * w).sin() + in;
  };
  torch::Tensor y = checkpointed
                        ? recompose::checkpoint(
                              CheckpointOptions().policy(SelectivePolicy({"aten::mul"})), body, x)
                        : body(x);
  y.sum().backward();
  return {y.detach(), x.grad(), w.grad()};
}

}  // namespace

TEST_SUITE("batch norm replay") {
  TEST_CASE("the replay's batch norm call gives the forward's outputs, dtypes and layouts") {
    // The op alone, as the replay calls it: the running statistics replaced by stand-ins.
    for (const at::ScalarType input_dtype : {at::kBFloat16, at::kHalf, at::kFloat})
      for (const bool weight : {false, true})
        for (const int dims : {0, 1, 2, 3})
          for (const bool channels_last : {false, true}) {
            if (channels_last && dims < 2) continue;
            CAPTURE(c10::toString(input_dtype));
            CAPTURE(weight);
            CAPTURE(dims);
            CAPTURE(channels_last);
            torch::manual_seed(1);
            std::vector<int64_t> sizes = {5, 3};
            for (int d = 0; d < dims; ++d) sizes.push_back(4);
            torch::Tensor x = torch::randn(sizes).to(input_dtype);
            if (channels_last && dims == 2) x = x.contiguous(at::MemoryFormat::ChannelsLast);
            if (channels_last && dims == 3) x = x.contiguous(at::MemoryFormat::ChannelsLast3d);
            torch::Tensor w = weight ? torch::rand({3}) + 0.5 : torch::Tensor();
            torch::Tensor b = weight ? torch::randn({3}) : torch::Tensor();
            torch::Tensor mean = torch::randn({3}), var = torch::rand({3}) + 0.5;
            const auto forward = at::native_batch_norm(x, w, b, mean.clone(), var.clone(),
                                                       /*training=*/true, 0.1, 1e-5);
            const auto stand_in_mean = recompose::detail::RunningStatStandIn::of(mean);
            const auto stand_in_var = recompose::detail::RunningStatStandIn::of(var);
            const auto replayed = at::native_batch_norm(x, w, b, stand_in_mean.make(),
                                                        stand_in_var.make(), true, 0.1, 1e-5);
            CHECK(same_bits({std::get<0>(forward), std::get<1>(forward), std::get<2>(forward)},
                            {std::get<0>(replayed), std::get<1>(replayed), std::get<2>(replayed)}));
            // The cause, as PyTorch 2.11 has it: without running statistics (what the replay
            // passed before), a low-precision input with no weight computes in its own dtype.
            const auto without = at::native_batch_norm(x, w, b, {}, {}, true, 0.1, 1e-5);
            if (input_dtype != at::kFloat && !weight) {
              CHECK((std::get<1>(without).scalar_type() == input_dtype));
              CHECK((std::get<1>(forward).scalar_type() == at::kFloat));
            }
          }
  }

  TEST_CASE("autocast, layouts, affine or not, tracked or not, train and eval: bitwise, replayed") {
    // The block: Linear or ConvNd, BatchNorm without affine parameters, ReLU, under CPU
    // autocast with the projection kept. The replay gave up at the first backward, or gave
    // gradients one bf16 ulp away.
    const SelectivePolicy keep_projections({"aten::mm", "aten::addmm", "aten::convolution"});
    for (const BnCase& c : all_cases()) {
      CAPTURE(str(c));
      const auto plain = steps(c, std::nullopt);
      recompose::reset_selective_replay_stats();
      const auto got = steps(c, keep_projections);
      const auto stats = recompose::selective_replay_stats();
      CHECK(same_bits(plain, got));
      CHECK(stats.replayed == 2);
      CHECK(stats.fallbacks == 0);
      // The transformer preset keeps the matmuls (Linear's addmm/mm); conv blocks keep nothing
      // then, and full checkpointing is bitwise too.
      CHECK(same_bits(plain, steps(c, recompose::transformer_policy())));
    }
  }

  TEST_CASE("a replayed op that returns its values in other strides: laid out as in the forward") {
    // Note [ A replayed op that returns another layout ] (replay_executor.cpp): the replay gave up
    // after using its kept outputs here before.
    const auto plain = flaky_step("recompose_replay_test::flaky_strides", false);
    recompose::reset_selective_replay_stats();
    const auto got = flaky_step("recompose_replay_test::flaky_strides", true);
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.replayed == 1);
    CHECK(stats.fallbacks == 0);
    CHECK(same_bits(plain, got));
  }

  TEST_CASE("a replayed op that returns other sizes: the determinism check's error, as a rerun") {
    // The replay and the forward run again report the same error, with the op's name, instead of
    // an internal error asking for a report.
    for (const bool replay : {true, false}) {
      CAPTURE(replay);
      rt::ReplaySwitch on(replay);
      try {
        (void)flaky_step("recompose_replay_test::flaky_sizes", true);
        FAIL("no error");
      } catch (const recompose::CheckpointError& e) {
        const std::string what = e.what();
        CHECK(what.find("different metadata than during the forward pass") != std::string::npos);
        CHECK(what.find("Please report") == std::string::npos);
        if (replay) CHECK(what.find("recompose_replay_test::flaky_sizes") != std::string::npos);
      }
    }
  }

  TEST_CASE("why a region would run its forward again: decided from the trace, in inspect_policy") {
    // The replay's plan decides before anything runs; inspect_policy reports the same reason as
    // training counts.
    torch::Tensor outside = torch::zeros({3});
    auto body = [&](const torch::Tensor& x) {
      outside.copy_(x.exp());      // an op of the region writes into an outside tensor
      return (outside * x).sin();  // ... and backward needs that version of it
    };
    torch::Tensor x = torch::randn({3}, torch::requires_grad());
    const SelectivePolicy recompute_all = rt::always(recompose::CheckpointPolicy::PREFER_RECOMPUTE);
    const auto report = recompose::inspect_policy(
        recompute_all, [&] { (void)body(x); }, {}, "writes outside");
    CHECK(report.replay_fallback_reason.find("outside tensor after an op of the region wrote") !=
          std::string::npos);
    CHECK(report.to_string().find("runs the region's forward again") != std::string::npos);
    recompose::reset_selective_replay_stats();
    recompose::checkpoint(CheckpointOptions().policy(recompute_all), body, x).sum().backward();
    const auto stats = recompose::selective_replay_stats();
    CHECK(stats.fallbacks == 1);
    CHECK(stats.last_fallback_reason == report.replay_fallback_reason);

    // A region the replay serves says so.
    auto plain_body = [](const torch::Tensor& in) { return in.exp().sin(); };
    const auto served = recompose::inspect_policy(
        recompute_all, [&] { (void)plain_body(x); }, {}, "replayed");
    CHECK(served.replay_fallback_reason.empty());
    CHECK(served.to_string().find("the replay rebuilds what the policy dropped") !=
          std::string::npos);
  }
}
