// The training loop: builds the model from a seed, attaches the checkpoint policy, trains with
// AdamW and records per-step loss, time and memory.
#pragma once

#include "data.h"
#include "model.h"
#include "policies.h"

#include <recompose/memory_plan.h>
#include <recompose/swap.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <vector>
#include "fused_adamw.h"

namespace gpt {

struct TrainOptions {
  Policy policy = Policy::None;
  int64_t steps = 300;
  int64_t batch = 16;
  double lr = 3e-3;
  uint64_t seed = 1337;
  torch::Device device = torch::kCPU;
  bool bf16 = false;  // forward under CUDA autocast to bfloat16 (CUDA only)
  bool phase_times =
      false;              // time forward and backward apart (synchronises the device between them)
  bool no_meter = false;  // no SavedTensorMeter: bytes_held stays 0
  // The last profile_steps steps under the Kineto profiler (OpProfile): the trace goes to
  // profile_dir, the summary to stdout.
  int64_t profile_steps = 0;
  std::filesystem::path profile_dir;
  // Every step under a recompose::StepLedger; the last step's is printed, and written as JSON to
  // profile_dir/ledger.json and its memory timeline to profile_dir/ledger-timeline.svg.
  bool ledger = false;
  std::string label = "train";               // shown before the progress bar
  std::filesystem::path save_initial_state;  // written before the first step when not empty
  // Policy::Planned: the plan applied to the blocks (recompose::apply_plan).
  std::shared_ptr<const recompose::Plan> plan;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double seconds = 0;
  double cpu_seconds = 0;      // process CPU time of the step: less disturbed by a busy machine
  int64_t bytes_held = 0;      // peak bytes autograd held for backward (SavedTensorMeter)
  int64_t peak_memory = 0;     // peak tensor memory allocated on the device during the step
  int64_t resting_memory = 0;  // allocated when the step starts: weights, optimizer state, batch
  // The peak of this run alone: what its trainer allocated when it was built (weights, optimizer
  // state) and its batch, plus the step's peak above the resting memory. peak_memory counts every
  // trainer of the process (--compare and --sweep hold several); this leaves the others out. On
  // CPU LibTorch's AdamW allocates its state in the first step, which this counts only there.
  int64_t own_peak_memory = 0;
  int64_t bytes_swapped = 0;  // bytes offloaded to host memory (swap, offload, a plan's swaps)
  // Where copies held the step up (SwapStats): offloads that waited on the host for older
  // groups' copies, reloads not landed when backward asked, and the host time waited.
  int64_t offload_waits = 0;
  int64_t late_reloads = 0;
  double swap_wait_seconds = 0;
  // cudaMalloc calls that failed and were retried after the allocator freed its cache (a tight
  // --memory-fraction shows here: each retry synchronises the device). 0 off CUDA.
  int64_t allocator_retries = 0;
  int64_t page_faults = 0;  // minor page faults of the process during the step (getrusage)
  // --phase-times: forward and backward, each ended by a device synchronisation (the rest of
  // the step is the optimizer); 0 otherwise.
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// Runs `run(k)` for each of `n` interleaved runs at step `step` (from 1), starting one run later
// each step: a clock that drifts during the comparison lands on every run alike, and no run
// always follows the same one (--compare, --sweep).
template <class Run>
void in_rotated_order(int64_t step, size_t n, Run run) {
  for (size_t i = 0; i < n; ++i) run((i + static_cast<size_t>(step)) % n);
}

// Median step time without the first step (one-time allocations and warm-up): what --compare
// and --sweep rank by, robust to one disturbed step.
double median_step_seconds(const std::vector<StepRecord>& steps);
// The median of forward + backward (--phase-times), the first step left out: the step a plan's
// estimate prices (recompose::Plan::step_seconds), without the optimizer.
double median_compute_seconds(const std::vector<StepRecord>& steps);
// The same of StepRecord::bytes_swapped: what a step moved to host memory (under the never-stall
// offload they change in its first 3 steps, its warm-up, and are fixed from the 4th on).
int64_t median_bytes_moved(const std::vector<StepRecord>& steps);

struct TrainResult {
  std::vector<StepRecord> steps;
  int64_t parameters = 0;
  int64_t tokens_per_step = 0;

  double final_loss() const { return steps.back().loss; }
  // Mean step time without the first step, which pays for one-time allocations and warm-up.
  double mean_step_seconds() const;
  double median_step_seconds() const { return gpt::median_step_seconds(steps); }
  double mean_step_cpu_seconds() const;  // same, CPU time
  // Same, of the forward and of the backward (--phase-times; 0 otherwise).
  double mean_forward_seconds() const;
  double mean_backward_seconds() const;
  int64_t peak_bytes_held() const;
  // Mean minor page faults per step without the first step: memory the allocator took from
  // the kernel again (see examples/common/allocator_tuning.h).
  double mean_page_faults() const;
  int64_t peak_memory() const;
  // Highest StepRecord::own_peak_memory: the peak of this run as if it were alone in the process.
  int64_t own_peak_memory() const;
  // Highest peak above the resting memory: activations, gradients and temporaries of a step.
  int64_t peak_step_memory() const;
  // Bytes a step moved to host memory (swap, offload; 0 otherwise): the median over the steps
  // without the first, like the step time.
  int64_t bytes_moved_per_step() const { return median_bytes_moved(steps); }
};

// The cross-entropy of the model's next-character predictions.
torch::Tensor loss_of(GPT& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                      bool bf16 = false);

// A freshly built model (from the seed), its policy or plan, AdamW, the batch stream and its own
// random state (dropout): one measured training step per call, so that several can be
// interleaved (--sweep) and each still draws what it would draw alone.
class Trainer {
 public:
  Trainer(const Config& config, const CharDataset& data, const TrainOptions& options);
  StepRecord step(int64_t step);  // step counts from 1
  GPT& model() { return model_; }
  int64_t tokens_per_step() const { return options_.batch * config_.context; }

 private:
  Config config_;
  const CharDataset& data_;
  TrainOptions options_;
  GPT model_{nullptr};
  std::shared_ptr<recompose::SwapManager> swap_manager_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;  // CPU
  std::unique_ptr<FusedAdamW> fused_optimizer_;     // CUDA (fused_adamw.h says why)
  at::Generator batches_;
  int64_t own_bytes_ = 0;  // device memory allocated by the constructor: weights, optimizer state
  at::Tensor
      rng_state_;  // the default generator of the device (dropout) between this trainer's steps
};

// Trains a freshly built model; the same seed gives the same weights, batches and dropout masks
// under every policy. Returns the trained model through `model_out` when given.
TrainResult train(const Config& config, const CharDataset& data, const TrainOptions& options,
                  GPT* model_out = nullptr);

// Mean cross-entropy over `batches` validation batches, without dropout.
double validation_loss(GPT& model, const CharDataset& data, int64_t batch, int64_t batches,
                       uint64_t seed, const torch::Device& device);

}  // namespace gpt
