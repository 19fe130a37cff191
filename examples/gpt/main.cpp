// gpt: trains a small character-level GPT with activation checkpointing from recompose.
//
//   gpt                              # no checkpointing, CPU (CUDA when available)
//   gpt --policy selective           # checkpoint every block with the transformer policy
//   gpt --compare --steps 20         # every policy, one table; exits 1 if the losses differ
#include "../common/allocator_tuning.h"
#include "compare.h"
#include "data.h"
#include "device_memory.h"
#include "model.h"
#include "offload_link.h"
#include "options.h"
#include "planning.h"
#include "progress.h"
#include "report.h"
#include "sample.h"
#include "sweep.h"
#include "train.h"

#include <recompose/apply_offload.h>
#include <recompose/cpu_memory_counting.h>
#include <recompose/planner.h>

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>

namespace {

torch::Device pick_device(const std::string& requested) {
  const bool cuda = torch::cuda::is_available();
  if (requested == "cuda" && !cuda) {
    throw gpt::UsageError(
        "--device cuda: no CUDA device (or this build of recompose/LibTorch has no CUDA)");
  }
  return (requested == "cuda" || (requested == "auto" && cuda)) ? torch::Device(torch::kCUDA, 0)
                                                                : torch::Device(torch::kCPU);
}

int run(const gpt::Options& options, examples::MallocTuning malloc_tuning) {
  const torch::Device device = pick_device(options.device);
  if (options.threads > 0) torch::set_num_threads(static_cast<int>(options.threads));
  // CPU peaks for the reports, the planner's profile and the ledger's timeline: on before any
  // tensor of the run is allocated.
  const recompose::CpuMemoryCounting cpu_counting;
  gpt::CharDataset data(options.data, options.context);
  gpt::Config config;
  config.vocab_size = data.vocab_size();
  config.context = options.context;
  config.layers = options.layers;
  config.width = options.width;
  config.heads = options.heads;
  config.dropout = options.dropout;

  gpt::TrainOptions train_options;
  train_options.policy = options.policy;
  train_options.steps = options.steps;
  train_options.batch = options.batch;
  train_options.lr = options.lr;
  train_options.seed = options.seed;
  train_options.device = device;
  if (options.bf16 && !device.is_cuda())
    throw gpt::UsageError("--bf16 needs --device cuda (CUDA autocast)");
  train_options.bf16 = options.bf16;
  train_options.phase_times = options.phase_times;
  train_options.no_meter = options.no_meter;
  train_options.profile_steps = options.profile_steps;
  train_options.ledger = options.ledger;
  train_options.profile_dir = options.out;
  train_options.save_initial_state = options.save_initial_state;

  std::filesystem::create_directories(options.out);
  std::printf("data %s: %lld characters, vocabulary of %lld\n", options.data.string().c_str(),
              static_cast<long long>(data.text().size()),
              static_cast<long long>(data.vocab_size()));
  std::printf(
      "model: %lld blocks, width %lld, %lld heads, context %lld, batch %lld, dropout %g%s; device "
      "%s, %d threads\n",
      static_cast<long long>(config.layers), static_cast<long long>(config.width),
      static_cast<long long>(config.heads), static_cast<long long>(config.context),
      static_cast<long long>(options.batch), config.dropout, options.bf16 ? ", bf16 autocast" : "",
      device.str().c_str(), torch::get_num_threads());
  std::printf("memory: %s\n", examples::describe(malloc_tuning));

  // Before --compare too: its offload-window run uses the link.
  gpt::set_link(options.link);
  gpt::set_offload_window(options.offload_window_ms * 1e-3);
  if (options.compare) {
    auto outcome = gpt::compare_policies(config, data, train_options, options.policies);
    gpt::write_csv(options.out / "compare.csv", outcome.results);
    gpt::write_cost_plot(options.out / "compare.svg", outcome.results, device);
    gpt::write_loss_plot(options.out / "compare_loss.svg", outcome.results,
                         "Training loss under each policy");
    std::printf("wrote %s, %s (cost against saving per policy) and %s (loss curves)\n",
                (options.out / "compare.csv").c_str(), (options.out / "compare.svg").c_str(),
                (options.out / "compare_loss.svg").c_str());
    return outcome.losses_match ? 0 : 1;
  }

  auto cap_memory = [&] {
    if (options.memory_fraction <= 0) return;
    if (gpt::cap_device_memory(device, options.memory_fraction)) {
      std::printf("device memory capped at %.4f of the device (caching allocator)\n",
                  options.memory_fraction);
    } else {
      std::printf("--memory-fraction %.4f: no effect on %s (caps the CUDA caching allocator)\n",
                  options.memory_fraction, device.str().c_str());
    }
  };
  if (options.sweep) {
    cap_memory();
    return gpt::run_sweep(config, data, train_options, options.out, options.sweep_peak);
  }
  if (options.budget.empty()) cap_memory();  // --budget: after profiling (below)
  if (!options.budget.empty() || !options.plan.empty()) {
    recompose::Plan plan;
    if (!options.plan.empty()) {
      plan = recompose::Plan::load(options.plan);
      std::printf("plan %s:\n", options.plan.c_str());
    } else {
      const auto budget =
          recompose::Budget::parse(options.budget);  // bad text fails before profiling
      // The profile runs the step without checkpointing (recompose::profile_memory), which a
      // cap meant to exclude no checkpointing cannot hold: it is taken first, then the cap, then
      // the trials, which run under the cap as the capped training will.
      auto planning = std::make_unique<gpt::PlanningStep>(config, data, train_options);
      const recompose::MemoryProfile profile = planning->profile();
      if (options.memory_fraction > 0)
        std::printf("profiled without the memory cap (the step without checkpointing)\n");
      cap_memory();
      plan = planning->choose(budget, gpt::solve_options(device));
      planning.reset();  // its model and optimizer state: not beside the training's
      profile.save(options.out / "profile.json");
      plan.save(options.out / "plan.json");
      std::printf(
          "planned for %s by measurement: %.1f ms (%.2f plain steps; the profile %.1f ms, %.2f "
          "plain steps; solving %.3f ms), saved to %s:\n",
          options.budget.c_str(), plan.planning_seconds * 1e3, plan.planning_steps,
          profile.profile_seconds * 1e3,
          profile.step_seconds > 0 ? profile.profile_seconds / profile.step_seconds : 0.0,
          plan.solve_seconds * 1e3, (options.out / "plan.json").c_str());
    }
    std::printf("%s\n", plan.to_table().c_str());
    train_options.policy = gpt::Policy::Planned;
    train_options.plan = std::make_shared<const recompose::Plan>(std::move(plan));
  }

  gpt::GPT model{nullptr};
  auto result = gpt::train(config, data, train_options, &model);
  std::printf("%lld parameters, %lld tokens per step\n", static_cast<long long>(result.parameters),
              static_cast<long long>(result.tokens_per_step));
  gpt::print_summary(result, train_options.policy, device);
  if (train_options.plan && train_options.plan->peak_bytes > 0) {
    std::printf("  plan's peak        %s simulated; %s measured (%s)\n",
                gpt::format_bytes(train_options.plan->peak_bytes).c_str(),
                gpt::format_bytes(result.own_peak_memory()).c_str(),
                device.is_cuda() ? "CUDA caching allocator, the run's own"
                                 : "CPU: no allocator peak there; the profile's resident bytes are "
                                   "the model's tensors only, so the two are not comparable");
  }
  if (train_options.plan && train_options.plan->step_seconds > 0) {
    // The estimate is of the profiled step (forward and backward, no optimizer): compare ratios.
    const recompose::Plan& plan = *train_options.plan;
    std::printf(
        "  plan's step        %.1f ms estimated, %.3fx the profiled step without "
        "checkpointing (%.1f ms); %.1f ms measured (median, optimizer included)\n",
        plan.step_seconds * 1e3, plan.step_seconds / plan.none_step_seconds,
        plan.none_step_seconds * 1e3, result.median_step_seconds() * 1e3);
  }
  if (recompose::total_offload_stats(*model).calls > 0) {
    // What offload moved, what stayed and why, over every step (divide by the steps for one).
    std::printf("offload over %lld steps:\n%s", static_cast<long long>(options.steps),
                recompose::offload_report(*model).c_str());
  }
  std::printf("  validation loss    %.4f\n",
              gpt::validation_loss(model, data, options.batch, 8, options.seed, device));
  const gpt::PolicyResults results{{train_options.policy, result}};
  gpt::write_csv(options.out / "loss.csv", results);
  gpt::write_loss_plot(
      options.out / "loss.svg", results,
      "Training loss, policy " + std::string(gpt::policy_name(train_options.policy)));
  std::printf("wrote %s and %s\n", (options.out / "loss.csv").c_str(),
              (options.out / "loss.svg").c_str());
  if (options.sample > 0) {
    std::printf(
        "\nsample:\n%s\n",
        gpt::sample(model, data, data.can_encode("Alice ") ? "Alice " : data.text().substr(0, 1),
                    options.sample, options.seed, device)
            .c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before the first tensor: otherwise glibc gives the step's memory back to the kernel every
  // step and faults it in again (see the header).
  const auto malloc_tuning = examples::tune_malloc_for_training();
  try {
    const auto options = gpt::parse_options(argc, argv);
    if (options.help) {
      std::cout << gpt::usage(argv[0]);
      return 0;
    }
    return run(options, malloc_tuning);
  } catch (const gpt::UsageError& e) {
    std::cerr << "gpt: " << e.what() << "\n\n" << gpt::usage(argv[0]);
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "gpt: " << e.what_without_backtrace()
              << '\n';  // LibTorch's backtrace helps nobody here
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt: " << e.what() << '\n';
    return 1;
  }
}
