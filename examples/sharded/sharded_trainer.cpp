// sharded_trainer: an FSDP-like data-parallel trainer on c10d (Gloo, or NCCL on GPUs), with
// recompose checkpointing and offload on the blocks that carry its all-gather hooks.
//
//   sharded_trainer --world 2 --steps 5 --checkpoint full
//   sharded_trainer --world 1 --device cuda --backend nccl --checkpoint full --offload --check
//
// Without --rank this process is the launcher: it starts --world copies of itself (the ranks),
// waits for them, and returns the run's exit code. Each rank holds 1/world of every unit's
// parameters; see fully_shard.h for the hooks and flat_shard.h for the buffers.
#include "../common/allocator_tuning.h"
#include "block_offload.h"
#include "collective_counts.h"
#include "device.h"
#include "fully_shard.h"
#include "launcher.h"
#include "model.h"
#include "optimizer.h"
#include "options.h"
#include "process_group.h"
#include "reference_check.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace sharded {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr auto kCollectiveTimeout = std::chrono::seconds(10);
constexpr double kTolerance = 1e-5;

// Mean of a per-rank scalar over the ranks (for printing the global loss). On the run's device:
// NCCL reduces device tensors only.
double mean_over_ranks(c10d::Backend& pg, double v, const torch::Device& device) {
  std::vector<at::Tensor> t{torch::tensor({v}, torch::kDouble).to(device)};
  wait(pg.allreduce(t));  // SUM: Gloo has no AVG for allreduce
  return t[0].item<double>() / pg.getSize();
}

void print_counts(const CollectiveCounts& n, const Options& o, int units, double seconds) {
  auto ag = [&](Phase p) { return (long long)n.gathers(p); };
  std::printf(
      "collectives on each rank (%d units = %d blocks + head, %d steps, checkpoint=%s%s, %s on "
      "%s):\n",
      units, o.blocks, o.steps, o.checkpoint.c_str(), o.offload ? ", offload" : "",
      o.backend.c_str(), o.device.c_str());
  std::printf("  all-gather      forward %lld  recompute %lld  backward %lld\n", ag(Phase::Forward),
              ag(Phase::Recompute), ag(Phase::Backward));
  std::printf("  reduce-scatter  backward %lld\n", (long long)n.scatters(Phase::Backward));
  std::printf("  all-reduce      %d (the printed loss, one per step)\n", o.steps);
  std::printf("  redundant all-gathers avoided (already unsharded): %lld\n",
              (long long)n.unshard_already_done);
  std::printf("  %.2f MB moved, %.3f s in collectives%s\n", n.bytes / 1e6, n.seconds,
              o.device == "cpu" ? "" : " (the current stream synchronised around each)");
  std::printf("time: %.3f s for %d steps (%.1f ms/step)\n", seconds, o.steps,
              1e3 * seconds / o.steps);
  std::fflush(stdout);
}

int run_rank(const Options& o) {
  die_with_launcher(o.launcher_pid);
  torch::set_num_threads(1);  // the ranks share the machine's cores
  const bool lead = o.rank == 0;
  const torch::Device device = rank_device(o);
  set_current_device(device);
  auto pg = make_process_group(o.backend, o.store, o.rank, o.world, device, kCollectiveTimeout);
  wait(pg->barrier());

  const ModelConfig cfg{o.blocks, o.width, o.hidden, 8};
  MlpModel model = make_model(cfg, o.seed);  // same init on every rank
  model->to(device);
  CollectiveCounts counts;
  CheckTally tally;
  std::vector<double> losses;
  {
    FullyShard fsdp(*pg, counts);
    auto shard_units = [&] {
      for (std::size_t i = 0; i < model->blocks->size(); ++i) {
        fsdp.add_unit(*model->blocks->ptr(i), "blocks." + std::to_string(i));
      }
      fsdp.add_unit(*model->head, "head");
    };
    std::shared_ptr<recompose::SwapManager> offload;
    auto checkpoint_blocks = [&] {
      if (o.checkpoint == "full") {
        for (const auto& b : *model->blocks) recompose::apply_checkpoint(*b);  // one line per block
      }
      if (o.offload) offload = offload_blocks(model);
    };
    if (o.hook_order == "trainer-first") {
      shard_units();
      checkpoint_blocks();
    } else {
      checkpoint_blocks();
      shard_units();
    }
    auto opt = make_optimizer(o, fsdp.shards());

    const auto t0 = Clock::now();
    for (int step = 0; step < o.steps; ++step) {
      const auto ts = Clock::now();
      auto [x, y] = make_batch(o.seed, o.rank, step, o.batch, cfg);
      auto loss = torch::mse_loss(model->forward(x.to(device)), y.to(device));
      loss.backward();
      fsdp.verify_step();  // throws unless each unit gathered once per phase and is resharded
      opt->step();
      opt->zero_grad();
      losses.push_back(mean_over_ranks(*pg, loss.item<double>(), device));
      if (lead) {
        std::printf("step %3d/%d  loss %.6f  %6.1f ms\n", step + 1, o.steps, losses.back(),
                    1e3 * since(ts));
        std::fflush(stdout);
      }
    }
    const double seconds = since(t0);
    if (lead) print_counts(counts, o, int(fsdp.units().size()), seconds);
    if (lead && offload) print_offload(model, *offload, counts);

    if (o.check) {
      fsdp.unshard_all();  // every rank takes part in the gathers
      if (lead) {
        std::printf(
            "sharded check (%d ranks, %d steps, checkpoint=%s%s, %s, hooks %s, %s on %s):\n",
            o.world, o.steps, o.checkpoint.c_str(), o.offload ? ", offload" : "", o.optim.c_str(),
            o.hook_order.c_str(), o.backend.c_str(), o.device.c_str());
        const bool ck = o.checkpoint == "full";
        const long long s = o.steps, b = o.blocks;
        tally.expect(true, std::string("every step: each unit 1 all-gather in forward, 1 in ") +
                               (ck ? "recompute (checkpointed blocks)" : "backward") +
                               ", 1 reduce-scatter, resharded after its backward");
        const bool totals = counts.gathers(Phase::Forward) == s * (b + 1) &&
                            counts.gathers(Phase::Recompute) == (ck ? s * b : 0) &&
                            counts.gathers(Phase::Backward) == (ck ? s : s * (b + 1)) &&
                            counts.scatters(Phase::Backward) == s * (b + 1);
        tally.expect(totals, "collective totals match " + std::to_string(b + 1) + " units x " +
                                 std::to_string(s) +
                                 " steps, no redundant all-gather in recompute");
        if (offload) {
          const auto moved = recompose::total_offload_stats(*model);
          tally.expect(moved.tensors_offloaded > 0 && offload->stats().tensors_reloaded > 0 &&
                           offload->tensors_alive() == 0,
                       "offload: " + std::to_string(moved.tensors_offloaded) +
                           " saved tensors went to host memory and came back; none left alive "
                           "after the last step");
        }
        const Reference ref = train_reference(o, cfg);
        compare_with_reference(model, losses, ref, cfg, kTolerance, tally);
        std::printf("sharded check: %d passed, %d failed\n", tally.passed(), tally.failed());
        std::fflush(stdout);
      }
      fsdp.reshard_all();
    }
  }  // hooks removed before the process group goes
  c10d::BarrierOptions last;
  last.timeout = std::chrono::seconds(60);  // the others wait here while rank 0 runs the reference
  wait(pg->barrier(last));
  pg->shutdown();  // NCCL: frees its communicators (and warns without it); Gloo: nothing
  pg.reset();      // joins Gloo's threads; all work was waited on
  return tally.failed() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace sharded

int main(int argc, char** argv) {
  // Each rank is this program again (launcher.cpp): every process keeps its step's memory
  // instead of giving it back to the kernel every step (see the header).
  examples::tune_malloc_for_training();
  const std::vector<std::string> args(argv + 1, argv + argc);
  sharded::Options o;
  try {
    o = sharded::parse_options(args);
  } catch (const std::invalid_argument& e) {
    if (*e.what()) std::fprintf(stderr, "sharded_trainer: %s\n", e.what());
    std::fputs(sharded::usage().c_str(), stderr);
    return 2;
  }
  if (o.rank < 0) {
    try {
      sharded::check_device_support(o);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "sharded_trainer: %s\n", e.what());
      return 2;
    }
    std::printf("sharded_trainer: %d ranks (c10d %s, %s), %d blocks + head, checkpoint=%s%s, %s\n",
                o.world, o.backend == "gloo" ? "Gloo on 127.0.0.1" : "NCCL", o.device.c_str(),
                o.blocks, o.checkpoint.c_str(), o.offload ? ", offload" : "", o.optim.c_str());
    std::fflush(stdout);
    return sharded::launch_ranks(o.world, args, o.timeout_s);
  }
  try {
    return sharded::run_rank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_trainer rank %d: %.2000s\n", o.rank, e.what());
    std::fflush(nullptr);
    // Peers may be blocked in a collective with us; the launcher kills them. Skip destructors
    // of objects that may be mid-collective (unwinding already released the locals).
    std::_Exit(1);
  }
}
