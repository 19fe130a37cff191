// The hook layer at work, and what an annotated forward costs when no hook is attached.
//
//   ./build/examples/hooks_demo/hooks_demo [--calls 200000]
#include <recompose/recompose.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct AnnotatedImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    return x + 1;
  }
};
TORCH_MODULE(Annotated);

struct PlainImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x + 1; }
};
TORCH_MODULE(Plain);

template <class M>
double ns_per_call(M& m, const torch::Tensor& x, int64_t calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) m(x);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t calls = 200000;
  if (argc == 3 && std::string(argv[1]) == "--calls") calls = std::stoll(argv[2]);

  // 1. Hooks at work.
  Annotated block;
  auto pre =
      recompose::hooks::register_forward_pre_hook(*block, [](recompose::hooks::ForwardCall& c) {
        std::printf("pre-hook:  input sum %.1f\n", c.input_leaves()[0].sum().item<double>());
      });
  auto post = recompose::hooks::register_forward_hook(*block, [](recompose::hooks::ForwardCall& c) {
    std::printf("post-hook: output sum %.1f\n", c.output_leaves()[0].sum().item<double>());
  });
  torch::nn::Sequential seq(block);
  seq->forward(torch::ones({3}));
  pre.remove();
  post.remove();

  // 2. Overhead of the annotation with no hook on the module.
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::ones({1});
  Plain plain;
  Annotated annotated;
  // Interleaved repetitions, minimum of each: the least disturbed run of each variant.
  double t_plain = 1e30, t_annot = 1e30, t_lookup = 1e30;
  Annotated other;
  for (int rep = 0; rep < 9; ++rep) {
    t_plain = std::min(t_plain, ns_per_call(plain, x, calls));
    t_annot = std::min(t_annot, ns_per_call(annotated, x, calls));
    // Some other module has a hook: the no-hook path now looks this module up in the table.
    auto h = recompose::hooks::register_forward_hook(*other, [](recompose::hooks::ForwardCall&) {});
    t_lookup = std::min(t_lookup, ns_per_call(annotated, x, calls));
    h.remove();
  }
  std::printf(
      "\nforward of x + 1 on a 1-element tensor, minimum of 9 interleaved runs of %lld calls:\n",
      (long long)calls);
  std::printf("  plain module:                       %7.1f ns/call\n", t_plain);
  std::printf("  annotated, no hooks anywhere:       %7.1f ns/call (+%.1f ns)\n", t_annot,
              t_annot - t_plain);
  std::printf("  annotated, hooks on another module: %7.1f ns/call (+%.1f ns)\n", t_lookup,
              t_lookup - t_plain);
  return 0;
}
