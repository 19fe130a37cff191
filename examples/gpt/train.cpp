#include "train.h"

#include "device_memory.h"
#include "initial_state.h"
#include "op_profile.h"
#include "progress.h"

#include <recompose/device_memory.h>
#include <recompose/planner.h>

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <recompose/memory_snapshot.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/step_ledger.h>
#include <recompose/swap.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <sys/resource.h>

namespace gpt {
namespace {

std::string status_line(const StepRecord& r, int64_t tokens_per_step) {
  char buffer[160];
  const double tokens_per_second = static_cast<double>(tokens_per_step) / std::max(r.seconds, 1e-9);
  std::snprintf(buffer, sizeof buffer,
                "loss %.4f | %.0f tok/s | held for backward %s | step peak %s", r.loss,
                tokens_per_second, format_bytes(r.bytes_held).c_str(),
                format_bytes(r.peak_memory - r.resting_memory).c_str());
  return buffer;
}

// Linear warm-up over the first 10% of the steps (Adam's early updates are noisy), then cosine
// decay to a tenth of the peak.
double learning_rate(double peak, int64_t step, int64_t steps) {
  const int64_t warmup = std::max<int64_t>(steps / 10, 1);
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(steps - warmup, 1));
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int64_t minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The generator dropout draws from on `device`.
at::Generator dropout_generator(const torch::Device& device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device)
                          : at::detail::getDefaultCPUGenerator();
}

}  // namespace

torch::Tensor loss_of(GPT& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                      bool bf16) {
  // --bf16: the forward under CUDA autocast (matrix products in bfloat16, reductions in float32),
  // as mixed-precision training runs do; backward follows the dtypes the forward chose.
  struct Autocast {
    bool on;
    explicit Autocast(bool enable) : on(enable) {
      if (!on) return;
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    }
    ~Autocast() {
      if (!on) return;
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    }
  } autocast(bf16 && inputs.is_cuda());
  auto logits = model(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

namespace {

// Mean over the steps without the first, which pays for one-time allocations and warm-up.
template <class Field>
double mean_without_first(const std::vector<StepRecord>& steps, Field field) {
  const auto first = steps.size() > 1 ? steps.begin() + 1 : steps.begin();
  const double total = std::accumulate(first, steps.end(), 0.0, [&](double s, const StepRecord& r) {
    return s + static_cast<double>(r.*field);
  });
  return total / static_cast<double>(steps.end() - first);
}

// The median of value_of(step) over the steps without the first (0 if none): an integer median
// of an even count rounds down, as integer division does.
template <class ValueOf>
auto median_without_first(const std::vector<StepRecord>& steps, ValueOf value_of) {
  using T = decltype(value_of(steps.front()));
  std::vector<T> v;
  for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) v.push_back(value_of(steps[i]));
  if (v.empty()) return T{0};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / T{2};
}

}  // namespace

double TrainResult::mean_step_seconds() const {
  return mean_without_first(steps, &StepRecord::seconds);
}
double median_step_seconds(const std::vector<StepRecord>& steps) {
  return median_without_first(steps, [](const StepRecord& r) { return r.seconds; });
}
double median_compute_seconds(const std::vector<StepRecord>& steps) {
  return median_without_first(
      steps, [](const StepRecord& r) { return r.forward_seconds + r.backward_seconds; });
}
int64_t median_bytes_moved(const std::vector<StepRecord>& steps) {
  return median_without_first(steps, [](const StepRecord& r) { return r.bytes_swapped; });
}
double TrainResult::mean_step_cpu_seconds() const {
  return mean_without_first(steps, &StepRecord::cpu_seconds);
}
double TrainResult::mean_page_faults() const {
  return mean_without_first(steps, &StepRecord::page_faults);
}
double TrainResult::mean_forward_seconds() const {
  return mean_without_first(steps, &StepRecord::forward_seconds);
}
double TrainResult::mean_backward_seconds() const {
  return mean_without_first(steps, &StepRecord::backward_seconds);
}

int64_t TrainResult::peak_bytes_held() const {
  int64_t peak = 0;
  for (const auto& r : steps) peak = std::max(peak, r.bytes_held);
  return peak;
}

int64_t TrainResult::peak_step_memory() const {
  // Without the first step, which also allocates the optimizer's state.
  const auto first = steps.size() > 1 ? steps.begin() + 1 : steps.begin();
  int64_t peak = 0;
  for (auto r = first; r != steps.end(); ++r)
    peak = std::max(peak, r->peak_memory - r->resting_memory);
  return peak;
}

int64_t TrainResult::peak_memory() const {
  int64_t peak = 0;
  for (const auto& r : steps) peak = std::max(peak, r.peak_memory);
  return peak;
}

int64_t TrainResult::own_peak_memory() const {
  int64_t peak = 0;
  for (const auto& r : steps) peak = std::max(peak, r.own_peak_memory);
  return peak;
}

Trainer::Trainer(const Config& config, const CharDataset& data, const TrainOptions& options)
    : config_(config),
      data_(data),
      options_(options),
      batches_(at::detail::createCPUGenerator(options.seed)) {
  // What this trainer holds between steps, as the allocator counts it (own_peak_memory).
  const int64_t allocated_before = current_memory(options.device);
  torch::manual_seed(options.seed);  // weights and dropout masks
  model_ = GPT(config);
  model_->to(options.device);
  model_->train();
  swap_manager_ = apply_policy(model_, options.policy);
  if (!options.save_initial_state.empty()) save_initial_state(options.save_initial_state, *model_);
  if (options.policy == Policy::Planned) {
    if (!options.plan) throw std::invalid_argument("Trainer: Policy::Planned needs a plan");
    // The trainer's own manager (apply_plan's default options), so that what the plan moves is
    // counted like the swap policies' moves.
    swap_manager_ = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
    recompose::apply_plan(*model_, *options.plan,
                          recompose::ApplyPlanOptions().swap_manager(swap_manager_));
  }
  if (options.device.is_cuda()) {
    fused_optimizer_ =
        std::make_unique<FusedAdamW>(model_->parameters(), 0.9, 0.99, /*weight_decay=*/0.01);
  } else {
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        model_->parameters(),
        torch::optim::AdamWOptions(options.lr).betas({0.9, 0.99}).weight_decay(0.01));
  }
  rng_state_ = dropout_generator(options.device).get_state();
  own_bytes_ = current_memory(options.device) - allocated_before;
}

StepRecord Trainer::step(int64_t step) {
  // This trainer's random state in, the previous one back out after the step.
  at::Generator gen = dropout_generator(options_.device);
  const at::Tensor outside = gen.get_state();
  gen.set_state(rng_state_);
  struct Restore {
    at::Generator& gen;
    at::Tensor& mine;
    const at::Tensor& outside;
    ~Restore() {
      mine = gen.get_state();
      gen.set_state(outside);
    }
  } restore{gen, rng_state_, outside};
  const double lr = learning_rate(options_.lr, step, options_.steps);
  if (optimizer_) {
    for (auto& group : optimizer_->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  auto [inputs, targets] =
      data_.batch(options_.batch, /*validation=*/false, batches_, options_.device);
  StepRecord record;
  record.step = step;
  // Frees last step's gradients before the step is measured.
  if (optimizer_)
    optimizer_->zero_grad();
  else
    fused_optimizer_->zero_grad();
  synchronize(options_.device);
  reset_peak_memory(options_.device);
  record.resting_memory = current_memory(options_.device);
  const int64_t retries_before = recompose::device_allocation_retries(options_.device);
  const int64_t faults_before = minor_page_faults();
  const double cpu_start = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  if (swap_manager_) swap_manager_->reset_stats();
  {
    // What autograd holds between this forward and backward (--no-meter: not counted; its hooks
    // cost host time per saved tensor).
    std::optional<recompose::SavedTensorMeter> meter;
    if (!options_.no_meter) meter.emplace();
    // Named spans for --profile (RecordFunction costs next to nothing without a profiler).
    torch::Tensor loss;
    {
      RECORD_USER_SCOPE("gpt::forward");
      loss = loss_of(model_, inputs, targets, options_.bf16);
    }
    auto since_start = [&] {
      synchronize(options_.device);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if (options_.phase_times) record.forward_seconds = since_start();
    {
      RECORD_USER_SCOPE("gpt::backward");
      recompose::ledger_mark("backward");  // the timeline's turn (--ledger)
      loss.backward();
    }
    if (options_.phase_times) record.backward_seconds = since_start() - record.forward_seconds;
    record.bytes_held = meter ? meter->peak_bytes_held() : 0;
    if (fused_optimizer_) {
      clip_grad_norm_foreach(model_->parameters(), 1.0);
      fused_optimizer_->step(lr);
    } else {
      torch::nn::utils::clip_grad_norm_(model_->parameters(), 1.0);
      optimizer_->step();
    }
    record.loss = loss.item<double>();  // also waits for the device
  }
  synchronize(options_.device);
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record.cpu_seconds = process_cpu_seconds() - cpu_start;
  record.page_faults = minor_page_faults() - faults_before;
  record.peak_memory = peak_memory(options_.device);
  record.own_peak_memory = own_bytes_ + static_cast<int64_t>(inputs.nbytes() + targets.nbytes()) +
                           record.peak_memory - record.resting_memory;
  record.allocator_retries = recompose::device_allocation_retries(options_.device) - retries_before;
  if (swap_manager_) {
    const auto stats = swap_manager_->stats();
    record.bytes_swapped = stats.bytes_offloaded;
    record.offload_waits = stats.offload_waits;
    record.late_reloads = stats.late_reloads;
    record.swap_wait_seconds = stats.wait_seconds;
  }
  return record;
}

TrainResult train(const Config& config, const CharDataset& data, const TrainOptions& options,
                  GPT* model_out) {
  Trainer trainer(config, data, options);
  TrainResult result;
  result.parameters = trainer.model()->parameter_count();
  result.tokens_per_step = trainer.tokens_per_step();
  ProgressBar progress(options.label, options.steps);
  const int64_t first_profiled = options.steps - std::min(options.profile_steps, options.steps) + 1;
  std::optional<OpProfile> profile;
  std::string last_ledger, last_ledger_json, last_ledger_svg;
  int64_t last_ledger_bytes = -1;  // what the rows hold at the turn: the regions' share
  // The last step's ledger, kept until the profile is saved: its Chrome trace joins the
  // profiler's (nothing runs between the step and the save).
  std::unique_ptr<recompose::StepLedger> last_step_ledger;
  for (int64_t step = 1; step <= options.steps; ++step) {
    if (options.profile_steps > 0 && step == first_profiled) {
      synchronize(options.device);
      profile.emplace(options.device.is_cuda());
    }
    std::unique_ptr<recompose::StepLedger> ledger;
    if (options.ledger) ledger = std::make_unique<recompose::StepLedger>(*trainer.model());
    // The last step's allocations for memory_viz (OUT/memory-snapshot.pickle).
    const bool snapshot = options.ledger && step == options.steps;
    if (snapshot) {
      recompose::record_memory_history(true,
                                       recompose::MemoryHistoryOptions().device(options.device));
    }
    result.steps.push_back(trainer.step(step));
    if (snapshot) recompose::record_memory_history(false);
    if (ledger && step == options.steps) {
      last_ledger = ledger->str();
      last_ledger_json = ledger->json();
      last_ledger_svg = ledger->svg();
      last_ledger_bytes = ledger->timeline().regions_at_turn;
      last_step_ledger = std::move(ledger);
    }
    ledger.reset();
    progress.update(step, status_line(result.steps.back(), result.tokens_per_step));
  }
  progress.finish();
  if (!last_ledger.empty()) {
    std::printf("ledger of step %lld:\n%s", static_cast<long long>(options.steps),
                last_ledger.c_str());
    // The status line's "held for backward" is the whole step's (its SavedTensorMeter); the
    // ledger's total is the regions' share of it.
    const int64_t whole = result.steps.back().bytes_held;
    if (last_ledger_bytes >= 0) {
      std::printf(
          "whole step (SavedTensorMeter): %s held for backward = the regions' %s at the "
          "turn + the rest of the step %s\n",
          format_bytes(whole).c_str(), format_bytes(last_ledger_bytes).c_str(),
          format_bytes(whole - last_ledger_bytes).c_str());
    }
    if (!options.profile_dir.empty()) {
      std::filesystem::create_directories(options.profile_dir);
      std::ofstream(options.profile_dir / "ledger.json") << last_ledger_json << "\n";
      std::ofstream(options.profile_dir / "ledger-timeline.svg") << last_ledger_svg;
      last_step_ledger->write_chrome_trace((options.profile_dir / "ledger-trace.json").string());
      recompose::dump_memory_snapshot((options.profile_dir / "memory-snapshot.pickle").string());
    }
  }
  if (profile) {
    synchronize(options.device);
    const std::string policy(policy_name(options.policy));
    const std::string title = "policy " + policy + ", steps " + std::to_string(first_profiled) +
                              "-" + std::to_string(options.steps);
    const auto trace = options.profile_dir / ("profile-" + policy + ".json");
    std::fputs(profile->finish(trace, title).c_str(), stdout);
    // One trace with the kernels and the ledger's slices and counters (--ledger).
    if (last_step_ledger) last_step_ledger->write_chrome_trace(trace.string(), trace.string());
  }
  last_step_ledger.reset();
  if (model_out) *model_out = trainer.model();
  return result;
}

double validation_loss(GPT& model, const CharDataset& data, int64_t batch, int64_t batches,
                       uint64_t seed, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto generator = at::detail::createCPUGenerator(seed);
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto [inputs, targets] = data.batch(batch, /*validation=*/true, generator, device);
    total += loss_of(model, inputs, targets).item<double>();
  }
  model->train();
  return total / static_cast<double>(batches);
}

}  // namespace gpt
