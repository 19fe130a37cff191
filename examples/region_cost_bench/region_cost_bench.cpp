// The fixed cost of a checkpointed region (issue 11, part 3): hooks, frame, RNG stash and
// recomputation bookkeeping, on a body so small that they dominate (Linear(4, 4) + tanh on a
// [4, 4] tensor). A step runs a chain of --regions blocks forward and backward; every variant
// has its own chain (same weights) and the variants run in alternation, --reps times.
//
// Printed per region, forward + backward, in process CPU time (1 thread), medians over the
// repetitions:
//   time         the variant's step time / regions
//   overhead     variant minus plain, paired within each repetition (what checkpointing costs)
//   - body       overhead minus one plain forward of the body, timed on its own
//   bookkeeping  overhead minus the overhead of "rerun body in backward" (paired): that variant
//                runs the body a second time from a tensor hook during backward, with no
//                checkpoint machinery, which is what a recomputation costs by itself. Run between
//                backward kernels the body takes about twice its time in a forward of its own
//                (its code and data are cold), so "- body" counts that slowdown as overhead.
//                Bookkeeping is what issue 11 bounds at 20 us. Offload recomputes nothing: its
//                overhead is the figure.
//
//   ./build/examples/region_cost_bench/region_cost_bench [--regions 100] [--steps 30] [--reps 15]
//       [--threads 1] [--only NAME-PREFIX] [--forward-only 1]
// --forward-only 1 times forwards alone (no backward, no recomputation): the forward's share.
#include <recompose/recompose.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t regions = 100, steps = 30, reps = 15, threads = 1;
  std::string only;  // run plain and the variants whose name starts with this (for profiling)
  bool forward_only = false;
};

const char* kUsage =
    "usage: region_cost_bench [--regions 100] [--steps 30] [--reps 15] [--threads 1] [--only "
    "NAME-PREFIX] "
    "[--forward-only 1]\n";

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") throw std::invalid_argument("");
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    if (k == "--only") {
      c.only = argv[i + 1];
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(argv[i + 1], &end, 10);
    if (*end != '\0' || v < 1) throw std::invalid_argument(k + " expects a positive integer");
    if (k == "--regions")
      c.regions = v;
    else if (k == "--steps")
      c.steps = v;
    else if (k == "--reps")
      c.reps = v;
    else if (k == "--threads")
      c.threads = v;
    else if (k == "--forward-only")
      c.forward_only = v != 0;
    else
      throw std::invalid_argument("unknown flag " + k);
  }
  return c;
}

// The trivial body: three saved tensors (addmm's two operands, tanh's result), two ops.
struct TinyImpl : torch::nn::Module {
  TinyImpl() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return torch::tanh(lin(x));
  }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Tiny);

using Call = std::function<torch::Tensor(Tiny&, const torch::Tensor&)>;

struct Variant {
  std::string name;
  std::vector<Tiny> chain;
  Call call;
  std::vector<double> seconds;
  bool recomputes = true;  // false: no recomputation to subtract (offload)
  bool baseline = false;   // the rerun variant: no bookkeeping of its own
};

std::vector<Tiny> make_chain(int64_t n) {
  torch::manual_seed(0);  // every chain has the same weights
  std::vector<Tiny> chain;
  for (int64_t i = 0; i < n; ++i) chain.emplace_back();
  return chain;
}

Call module_call() {
  return [](Tiny& b, const torch::Tensor& x) { return b(x); };
}

// CPU time of the process: on a shared machine, wall time also counts the time other
// processes hold the core (with one thread, CPU time is this thread's work).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Forward and backward of the whole chain, `steps` times; CPU seconds per sample.
double sample(Variant& v, const torch::Tensor& x, int64_t steps, bool backward = true) {
  const double t0 = cpu_seconds();
  for (int64_t s = 0; s < steps; ++s) {
    torch::Tensor y = x;
    for (auto& b : v.chain) y = v.call(b, y);
    if (backward) y.sum().backward();
  }
  return cpu_seconds() - t0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  try {
    c = parse(argc, argv);
  } catch (const std::exception& e) {
    if (*e.what()) std::cerr << "region_cost_bench: " << e.what() << "\n";
    std::cerr << kUsage;
    return 2;
  }
  at::set_num_threads(static_cast<int>(c.threads));

  // --only: plain, the rerun baseline and the variants whose name starts with it. The others get
  // an empty chain, so that their setup (a selective policy reads every operator name) is
  // skipped too, and are dropped below.
  auto wanted = [&](const std::string& name) {
    const std::string trimmed = name.substr(name.find_first_not_of(' '));
    return c.only.empty() || trimmed == "plain" || trimmed == "rerun body in backward" ||
           trimmed.starts_with(c.only);
  };
  std::vector<Variant> variants;
  auto add = [&](std::string name, Call call = module_call()) -> std::vector<Tiny>& {
    const int64_t regions = wanted(name) ? c.regions : 0;
    variants.push_back(Variant{std::move(name), make_chain(regions), std::move(call), {}});
    return variants.back().chain;
  };
  add("plain");
  // The recomputation alone: the body run again from a tensor hook when backward reaches the
  // block's output, under grad mode like a recomputation, with its results dropped.
  add("rerun body in backward", [](Tiny& b, const torch::Tensor& x) {
    torch::Tensor y = b(x);
    y.register_hook([m = b.ptr(), x](const torch::Tensor&) {
      at::AutoGradMode grad_on(true);
      (void)m->forward(x);
    });
    return y;
  });
  variants.back().baseline = true;
  for (auto& b : add("hooks only (no-op pre+post)")) {
    recompose::hooks::register_forward_pre_hook(*b, [](recompose::hooks::ForwardCall&) {});
    recompose::hooks::register_forward_hook(*b, [](recompose::hooks::ForwardCall&) {});
  }
  variants.back().recomputes = false;
  for (auto& b : add("apply_checkpoint")) recompose::apply_checkpoint(b);
  for (auto& b : add("  no RNG stash"))
    recompose::apply_checkpoint(b, recompose::CheckpointOptions().preserve_rng_state(false));
  for (auto& b : add("  no module state")) {
    recompose::apply_checkpoint(b, recompose::CheckpointOptions().preserve_module_state(false));
  }
  for (auto& b : add("  no early stop"))
    recompose::apply_checkpoint(b, recompose::CheckpointOptions().early_stop(false));
  add("checkpoint(fn, x)", [](Tiny& b, const torch::Tensor& x) {
    return recompose::checkpoint([m = b.ptr()](const torch::Tensor& in) { return m->forward(in); },
                                 x);
  });
  for (auto& b : add("selective (save addmm)")) {
    recompose::apply_checkpoint(
        b, recompose::CheckpointOptions().policy(recompose::SelectivePolicy({"aten::addmm"})));
  }
  // Offload: every saved activation through the swap manager (host-to-host copies on CPU), and
  // with nothing eligible (the default 1 MiB threshold): the hooks and batch bookkeeping alone.
  auto copies = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
  for (auto& b : add("apply_offload (copies)"))
    recompose::apply_offload(b, recompose::OffloadOptions().manager(copies));
  variants.back().recomputes = false;
  auto threshold = recompose::SwapManager::create();
  for (auto& b : add("apply_offload (none eligible)")) {
    recompose::apply_offload(b, recompose::OffloadOptions().manager(threshold));
  }
  variants.back().recomputes = false;

  std::erase_if(variants, [&](const Variant& v) { return !wanted(v.name); });
  torch::Tensor x = torch::randn({4, 4});
  Variant& plain = variants.front();
  for (auto& v : variants) sample(v, x, 2);  // warm-up: allocator, thread pools, dispatch caches
  std::vector<double> plain_forward;         // the body alone: what a recomputation runs again
  for (int64_t r = 0; r < c.reps; ++r) {
    for (auto& v : variants) v.seconds.push_back(sample(v, x, c.steps, !c.forward_only));
    plain_forward.push_back(sample(plain, x, c.steps, /*backward=*/false));
  }

  const double per =
      1e6 / static_cast<double>(c.steps * c.regions);  // seconds per sample -> us per region
  const double body_us = median(plain_forward) * per;
  std::printf(
      "recompose region_cost_bench: body Linear(4,4)+tanh on [4,4], %lld regions x %lld steps per "
      "sample, "
      "%lld alternating reps, LibTorch %s, %d threads\n",
      (long long)c.regions, (long long)c.steps, (long long)c.reps, TORCH_VERSION,
      at::get_num_threads());
  std::printf("per region, %s, CPU time, medians (us); plain forward of the body: %.2f us\n",
              c.forward_only ? "forward only" : "forward + backward", body_us);
  std::printf("%-30s %10s %10s %10s %12s\n", "variant", "time", "overhead", "- body",
              "bookkeeping");
  const Variant* rerun = nullptr;
  for (const auto& v : variants) {
    if (v.baseline) rerun = &v;
  }
  auto paired = [&](const Variant& v, const Variant& base) {
    std::vector<double> diff;
    for (int64_t r = 0; r < c.reps; ++r) diff.push_back((v.seconds[r] - base.seconds[r]) * per);
    return median(diff);
  };
  for (auto& v : variants) {
    const double time = median(v.seconds) * per;
    if (&v == &plain) {
      std::printf("%-30s %10.2f\n", v.name.c_str(), time);
      continue;
    }
    const double overhead = paired(v, plain);
    auto cell = [](double us) {
      char text[32];
      std::snprintf(text, sizeof text, "%.2f", us);
      return std::string(text);
    };
    std::string body = "-", bookkeeping = "-";
    if (v.recomputes && !c.forward_only) {
      body = cell(overhead - body_us);
      // Paired with the rerun variant of the same repetition: overhead(v) - overhead(rerun).
      if (rerun != nullptr && !v.baseline) bookkeeping = cell(paired(v, *rerun));
    } else if (!v.recomputes) {
      bookkeeping = cell(overhead);
    }
    std::printf("%-30s %10.2f %10.2f %10s %12s\n", v.name.c_str(), time, overhead, body.c_str(),
                bookkeeping.c_str());
  }
  return 0;
}
