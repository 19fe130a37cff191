#include <recompose/checkpoint.h>

#include <range/v3/action/push_back.hpp>
#include <range/v3/range/operations.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include <stdexcept>
#include <string>

namespace recompose {

torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                    const torch::Tensor& input, const CheckpointOptions& options) {
  const int64_t n = static_cast<int64_t>(sequential->size());
  if (segments < 1 || segments > n) {
    throw std::invalid_argument(
        "recompose: checkpoint_sequential: segments must be between 1 and the number of "
        "modules (" +
        std::to_string(n) + "), got " + std::to_string(segments));
  }
  std::shared_ptr<torch::nn::SequentialImpl> seq = sequential.ptr();
  auto run = [seq](int64_t first, int64_t last, const torch::Tensor& x) {
    torch::Tensor h = x;
    for (auto it = seq->begin() + first; it != seq->begin() + last + 1; ++it)
      h = it->forward<torch::Tensor>(h);
    return h;
  };
  // As PyTorch: segments of n / segments modules; every segment but the last is checkpointed.
  const int64_t size = n / segments;
  auto checkpointed =
      ranges::views::iota(int64_t{0}, size * (segments - 1)) | ranges::views::chunk(size);
  torch::Tensor h = input;
  int64_t end = -1;
  for (auto segment : checkpointed) {
    const int64_t start = ranges::front(segment);
    end = ranges::back(segment);
    // The segment's modules are known here: preserve their state across the recomputation.
    CheckpointOptions segment_options = options;
    ranges::push_back(segment_options.state_modules(),
                      segment | ranges::views::transform([&](int64_t i) { return seq->ptr(i); }));
    h = checkpoint(
        segment_options, [run, start, end](const torch::Tensor& x) { return run(start, end, x); },
        h);
  }
  return run(end + 1, n - 1, h);
}

}  // namespace recompose
