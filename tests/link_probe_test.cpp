// The link probe (measure_link), and the never-stall offload and peak budget on a real CUDA
// device (issue 27's GPU part). Compiled everywhere; the CUDA cases skip themselves visibly where
// no CUDA device is available at run time (doctest counts them as skipped).
#include "support/deterministic_cuda.h"
#include "support/grad_check.h"

#include <recompose/recompose.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

bool has_cuda_device() {
  static const bool yes = [] {
    const bool available = torch::cuda::is_available();
    if (!available)
      std::cout << "[link_probe_test] no CUDA device at run time: suite \"cuda_link\" skipped\n";
    return available;
  }();
  return yes;
}

const c10::Device kCuda(c10::kCUDA, 0);

// Blocks of a wide MLP, large enough that copies take measurable time.
struct LinkBlockImpl : torch::nn::Module {
  explicit LinkBlockImpl(int64_t w) {
    up = register_module("up", torch::nn::Linear(w, 4 * w));
    down = register_module("down", torch::nn::Linear(4 * w, w));
  }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return x + down(torch::gelu(up(x)));
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(LinkBlock);

struct LinkNetImpl : torch::nn::Module {
  LinkNetImpl(int n, int64_t w) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < n; ++i) {
      blocks.emplace_back(w);
      list->push_back(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x.pow(2).mean();
  }
  std::vector<LinkBlock> blocks;
};
TORCH_MODULE(LinkNet);

#ifdef RECOMPOSE_WITH_CUDA
int64_t cuda_peak() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}
#endif

}  // namespace

TEST_CASE("measure_link: refuses a device it cannot measure, with a clear error") {
  CHECK_THROWS_WITH_AS(recompose::measure_link(c10::Device(c10::kCPU)),
                       doctest::Contains("not a CUDA device"), recompose::CheckpointError);
  if (!has_cuda_device()) {
    CHECK_THROWS_AS(recompose::measure_link(kCuda), recompose::CheckpointError);
  }
}

TEST_CASE("device memory: not measured on CPU, said as -1") {
  const c10::Device cpu(c10::kCPU);
  recompose::reset_peak_device_memory(cpu);  // nothing to reset, no error
  torch::Tensor t = torch::ones({1024});
  CHECK(recompose::peak_device_memory(cpu) == -1);
  CHECK(recompose::current_device_memory(cpu) == -1);
}

TEST_SUITE_BEGIN("cuda_link" * doctest::skip(!has_cuda_device()));

#ifdef RECOMPOSE_WITH_CUDA
TEST_CASE("device memory: the caching allocator's peak and current bytes") {
  recompose::reset_peak_device_memory(kCuda);
  const int64_t before = recompose::current_device_memory(kCuda);
  {
    torch::Tensor t = torch::ones({1 << 20}, torch::TensorOptions().device(kCuda));  // 4 MiB
    CHECK(recompose::current_device_memory(kCuda) >= before + (int64_t{4} << 20));
  }
  CHECK(recompose::peak_device_memory(kCuda) >= before + (int64_t{4} << 20));
  CHECK(recompose::peak_device_memory(kCuda) == cuda_peak());
  recompose::reset_peak_device_memory(kCuda);
  CHECK(recompose::peak_device_memory(kCuda) < before + (int64_t{4} << 20));
}
#endif

TEST_CASE("measure_link: both directions and the cost per copy, in plausible ranges") {
  const auto link = recompose::measure_link(kCuda);
  MESSAGE("D2H " << link.d2h_bytes_per_second / 1e9 << " GB/s, H2D "
                 << link.h2d_bytes_per_second / 1e9 << " GB/s, " << link.seconds_per_copy * 1e6
                 << " us per copy");
  CHECK(link.valid());
  CHECK(link.d2h_bytes_per_second > 1e9);  // any PCIe 3 x16 link or better
  CHECK(link.d2h_bytes_per_second < 1e12);
  CHECK(link.h2d_bytes_per_second > 1e9);
  CHECK(link.h2d_bytes_per_second < 1e12);
  CHECK(link.seconds_per_copy < 1e-3);
}

TEST_CASE("never-stall offload on CUDA: gradients equal, copies landed, bandwidth reported") {
  rt::DeterministicCuda deterministic;
  torch::manual_seed(0);
  LinkNet net(6, 1024);
  net->to(kCuda);
  auto x = torch::randn({4096, 1024}, torch::TensorOptions().device(kCuda));
  auto plain = rt::grads_of([&] { return net(x); }, net->parameters());
  auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
  const auto link = recompose::measure_link(kCuda);
  for (auto& b : net->blocks) {
    recompose::apply_offload(b, recompose::OffloadOptions().manager(manager).never_stall(link));
  }
  // Six steps: three choose by their own windows, the fourth decides, and from it on every step
  // moves the same bytes (Note [ Never-stall offload decides once ]).
  std::vector<int64_t> moved;
  for (int step = 0; step < 6; ++step) {
    for (auto& b : net->blocks) recompose::reset_offload_stats(*b);
    auto grads = rt::grads_of([&] { return net(x); }, net->parameters());
    CHECK(rt::bitwise_equal(grads, plain));
    moved.push_back(recompose::total_offload_stats(*net).bytes_offloaded);
  }
  for (size_t step = 3; step < moved.size(); ++step) CHECK(moved[step] == moved[3]);
  torch::cuda::synchronize();
  const auto total = recompose::total_offload_stats(*net);
  MESSAGE("\n" << recompose::offload_report(*net));
  CHECK(total.bytes_offloaded + total.bytes_over_window + total.bytes_left_on_device > 0);
  if (total.bytes_offloaded > 0) CHECK(total.achieved_bytes_per_second() > 0);
}

// What this checks: the caching allocator's measured peak stays at or below 1.05x the budget. It
// is not a lower bound and not "within 5%": on an H100 (2026-11-26, runs 14 and 15) the measured
// peak was 0.70x and 0.81x of the budget, and the solver refused 0.5 of the plain peak.
TEST_CASE("peak budget on CUDA: the measured peak stays at or below 1.05x the budget") {
#ifdef RECOMPOSE_WITH_CUDA
  torch::manual_seed(0);
  LinkNet net(8, 1024);
  net->to(kCuda);
  auto x = torch::randn({4096, 1024}, torch::TensorOptions().device(kCuda));
  auto step = [&] { net(x).backward(); };
  step();  // warm-up: gradients allocated, kernels chosen
  const auto profile = recompose::profile_memory(*net, step);
  CHECK(profile.resident_bytes > 0);
  const auto options = recompose::SolveOptions().link(recompose::measure_link(kCuda));
  const int64_t top = profile.resident_bytes + profile.bytes_held;
  int planned = 0;  // budgets the solver accepted, so measured
  for (double f : {0.5, 0.7, 0.9}) {
    const int64_t budget = static_cast<int64_t>(f * static_cast<double>(top));
    CAPTURE(f);
    recompose::Plan plan;
    try {
      plan = recompose::solve_plan(profile, recompose::Budget::peak_bytes(budget), options);
    } catch (const std::invalid_argument& e) {
      MESSAGE("no plan at " << f << ": " << std::string(e.what()));
      continue;
    }
    recompose::apply_plan(*net, plan);
    step();
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    step();
    torch::cuda::synchronize();
    const int64_t measured = cuda_peak();
    MESSAGE("budget " << budget << ", simulated " << plan.peak_bytes << ", measured " << measured
                      << " (" << static_cast<double>(measured) / static_cast<double>(budget)
                      << "x the budget)");
    CHECK(static_cast<double>(measured) <= 1.05 * static_cast<double>(budget));
    recompose::remove_plan(*net, plan);
    ++planned;
  }
  // A refused budget is skipped: the case must still have measured some (two of three on an
  // H100, 2026-11-26).
  CHECK(planned >= 2);
#else
  MESSAGE("built without CUDA (-Dcuda=enabled): the caching allocator's peak cannot be read");
#endif
}

TEST_SUITE_END();
