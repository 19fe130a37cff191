// Randomized differential test: seeded random models (tests/support/random_model.h), each trained
// for a few steps twice, once plain and once with recompose applied (a random checkpointing
// choice per region). Oracle: loss, every gradient, every parameter after the optimizer step,
// every buffer and the CPU generator's state (and the CUDA generator's, on CUDA) bitwise equal
// after every step; no exception. The same cases run on the CPU and, where a CUDA device is, on
// CUDA with deterministic algorithms.
//
// Environment:
//   RECOMPOSE_DIFF_CASES=N         number of cases (default 500: the CI share)
//   RECOMPOSE_DIFF_SEED=S          first seed (default 1); cases use seeds S, S+1, ...
//   RECOMPOSE_DIFF_ONLY=S          run the one case of seed S (prints its description)
//   RECOMPOSE_DIFF_FEATURES=spec   switch features off/on: "-bn,-autocast", "none,+sac_fn",
//                                  "-known" (the features of bugs known when this was written);
//                                  "help" lists them
//   RECOMPOSE_DIFF_MAX_OPS / _MAX_BLOCKS / _MAX_DEPTH   model size limits (default 6 / 3 / 2)
//   RECOMPOSE_DIFF_VERBOSE=1       print every case's description
//   RECOMPOSE_DIFF_ATTRIBUTE=1     rerun each failing case with each known-buggy feature switched
//                                  off alone and report which switches make it pass (default on
//                                  with RECOMPOSE_DIFF_ONLY)
//   RECOMPOSE_DIFF_PRINT=N         print at most N failing cases in full (default 40)
//   RECOMPOSE_DIFF_CUDA_CASES=N    cases of the CUDA run (default 300; it runs where a CUDA device
//                                  is, with deterministic algorithms, and is skipped visibly
//                                  elsewhere)
// scripts/differential.sh runs 10,000 cases.
//
// "-known" switches off the features that hit the bugs known when this test was written, so that
// a run shows what else fails: bn (BatchNorm running stats updated again by the recomputation),
// eval_switch (train/eval flipped between forward and backward changes the recomputation),
// sac_random (a random op whose output a selective policy keeps is replayed without advancing
// the generator, so a later random op in the region draws other numbers), nested_sac and
// nested_must_swap (selective regions nested in selective regions, with and without MUST_SWAP),
// autocast (casts cached by autocast during the recomputation outlive it); and the features of
// issue 23 (module state decided by value and put in place with Tensor::set_): bn_twice (a block
// called twice per step), bn_shared (a BatchNorm shared by regions), bn_outside (and called
// outside any region: its saved running statistics failed autograd's version check), bn_idle (a
// call that leaves the running mean as it was, so it was taken as unwritten).
//
// Models never modify a block's input or a block's output in place (a kept output modified in
// place after its region is a documented CheckpointError), and retain_graph cases use no
// selective regions (a second backward over one is "backward an extra time" by design).
#include "support/deterministic_cuda.h"
#include "support/random_model.h"

#include <recompose/recompose.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using rt::diff::CaseDesc;
using rt::diff::Features;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The device the cases run on: the CPU, or CUDA in the CUDA run.
c10::Device g_device(c10::kCPU);

// An autocast scope as torch.autocast(device_type=<the cases' device>, dtype=torch.bfloat16) has:
// the cast cache is cleared when the outermost scope exits.
class AutocastScope {
 public:
  explicit AutocastScope(bool on, bool fp16 = false) : on_(on), type_(g_device.type()) {
    if (!on_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, fp16 ? at::kHalf : at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_;
  c10::DeviceType type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

struct Record {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // in the order they were taken
  std::string error;                                           // what the run threw, if it threw
  void add(const std::string& name, const torch::Tensor& t) {
    tensors.emplace_back(name, t.defined() ? t.detach().clone() : torch::Tensor());
  }
};

// Tensors the case managers offloaded (MUST_SWAP, swap_inputs, AsyncSaveOnCpu): shows that the
// swap paths ran.
int64_t g_offloaded = 0;

torch::Tensor cpu_rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

// The planner's share of a case: at the start of step `at_step` (after that step's seed), the
// plain model is profiled, a plan solved for a budget between the least any plan holds and no
// checkpointing, and applied for the steps that follow.
struct PlanSpec {
  int at_step = 0;
  double budget = 0.5;          // where between the least and 1.05 of the bytes held
  bool offload = false;         // OffloadMode::Always (on CPU: apply_offload and MUST_SWAP run)
  bool optimizer_step = false;  // the profiled step also steps a stateless SGD
  bool plan_memory = false;  // plan_memory (profiling again) instead of solve_plan on the profile
  // The profiled step runs the model inside a full checkpoint (as checkpoint_sequential's
  // segments do): backward recomputes every profiled module (issue 31, item 6).
  bool enclosed = false;
  std::string str() const {
    return "plan{at_step=" + std::to_string(at_step) + " budget=" + std::to_string(budget) +
           (offload ? " offload" : "") + (optimizer_step ? " sgd_step" : "") +
           (plan_memory ? " plan_memory" : "") + (enclosed ? " enclosed" : "") + "}";
  }
};

PlanSpec plan_spec(uint64_t seed, int steps) {
  std::mt19937_64 rng(seed * 7919 + 17);
  PlanSpec p;
  p.at_step = static_cast<int>(rng() % static_cast<uint64_t>(steps));
  p.budget = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  p.offload = rng() % 3 == 0;
  p.optimizer_step = rng() % 2 == 0;
  p.plan_memory = rng() % 2 == 0;
  p.enclosed = rng() % 3 == 0;  // drawn last: the earlier draws stay those of earlier seeds
  return p;
}

// Modules the planned cases' plans checkpointed or offloaded: shows that the plans did something.
int64_t g_planned_modules = 0;

// Profiles the plain `model` with a step like the case's, solves and applies the plan.
void profile_and_apply_plan(const CaseDesc& c, const PlanSpec& spec, rt::diff::RandModelImpl& model,
                            const torch::Tensor& x,
                            const std::shared_ptr<recompose::SwapManager>& manager);

// What a run_case records beyond training: the counters (SwapStats, SelectiveReplayStats), and
// the sinks listening while it trains (a StepLedger, and the memory history's snapshot sink).
struct Observed {
  bool counters = false;
  bool listening = false;
};

// The step ledger and the memory_viz recording for one run, stopped however the run ends.
struct ListeningSinks {
  recompose::CpuMemoryCounting counting;  // the CPU snapshot records the counting allocator's trace
  std::optional<recompose::StepLedger> ledger;
  ListeningSinks() {
    recompose::record_memory_history(true);
    ledger.emplace();
  }
  ~ListeningSinks() {
    ledger.reset();
    recompose::record_memory_history(false);
  }
};

// The counters' counts as tensors of the record (their times left out: they vary run to run).
void add_counters(Record& rec, const recompose::SwapStats& swap,
                  const recompose::SelectiveReplayStats& before,
                  const recompose::SelectiveReplayStats& after) {
  auto add = [&](const char* name, int64_t value) {
    rec.add(std::string("counter ") + name, torch::tensor(value));
  };
  add("swap tensors_offloaded", swap.tensors_offloaded);
  add("swap bytes_offloaded", swap.bytes_offloaded);
  add("swap tensors_reloaded", swap.tensors_reloaded);
  add("swap bytes_reloaded", swap.bytes_reloaded);
  add("swap tensors_kept", swap.tensors_kept);
  add("swap bytes_kept", swap.bytes_kept);
  add("swap shared_offloads", swap.shared_offloads);
  add("swap prefetched", swap.prefetched);
  add("swap sync_loads", swap.sync_loads);
  add("swap late_reloads", swap.late_reloads);
  add("swap early_returns", swap.early_returns);
  add("swap pool_hits", swap.pool_hits);
  add("swap pool_misses", swap.pool_misses);
  add("swap groups", swap.groups);
  add("swap offload_waits", swap.offload_waits);
  add("replay replayed", after.replayed - before.replayed);
  add("replay fallbacks", after.fallbacks - before.fallbacks);
  add("replay ops_run", after.ops_run - before.ops_run);
  add("replay ops_skipped", after.ops_skipped - before.ops_skipped);
  add("replay ops_substituted", after.ops_substituted - before.ops_substituted);
  add("replay draws_written", after.draws_written - before.draws_written);
  add("replay casts_kept", after.casts_kept - before.casts_kept);
  add("replay writes_carried", after.writes_carried - before.writes_carried);
}

// Trains the case's model for its steps, plain (checkpointed = false) or with recompose; with
// `plan`, plain until the plan is made and applied; `observed` says what else it records and
// whether sinks listen meanwhile.
Record run_case(const CaseDesc& c, bool checkpointed, const std::vector<torch::Tensor>& inputs,
                const PlanSpec* plan = nullptr, Observed observed = {}) {
  Record rec;
  std::optional<ListeningSinks> sinks;
  if (observed.listening) sinks.emplace();
  const recompose::SelectiveReplayStats replays_before = recompose::selective_replay_stats();
  try {
    at::autocast::clear_cache();  // nothing left over from an earlier case
    auto manager = recompose::SwapManager::create(
        recompose::SwapOptions().min_bytes(0).prefetch_groups(c.prefetch));
    torch::manual_seed(static_cast<uint64_t>(c.seed));
    auto model = std::make_shared<rt::diff::RandModelImpl>(c, checkpointed, manager);
    model->to(g_device);
    // Each parameter once: a shared BatchNorm is reached through every block that uses it.
    std::vector<torch::Tensor> params;
    for (const auto& p : model->parameters()) {
      if (std::none_of(params.begin(), params.end(),
                       [&](const torch::Tensor& q) { return q.is_same(p); })) {
        params.push_back(p);
      }
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (c.adam) {
      opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
    } else {
      opt =
          std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
    }
    const auto named = model->named_parameters();
    for (int step = 0; step < c.steps; ++step) {
      const std::string at = "step " + std::to_string(step) + " ";
      torch::Tensor x = inputs[static_cast<size_t>(step)].clone();
      if (c.x_grad) x.requires_grad_(true);
      model->train(!c.eval);
      torch::manual_seed(static_cast<uint64_t>(c.seed) * 1000003ULL + static_cast<uint64_t>(step) +
                         1);
      if (plan && plan->at_step == step)
        profile_and_apply_plan(c, *plan, *model, inputs[0], manager);
      opt->zero_grad();
      torch::Tensor loss;
      {
        std::optional<recompose::SwitchGuard> es;
        if (checkpointed && c.es_guard != 0)
          es.emplace(recompose::set_checkpoint_early_stop(c.es_guard == 1));
        std::optional<recompose::AsyncSaveOnCpu> offload;
        if (checkpointed && c.async_save) offload.emplace(manager);
        AutocastScope autocast(c.autocast, c.autocast_fp16);
        torch::Tensor out = model->forward(
            x, checkpointed && c.async_save && c.async_groups ? manager.get() : nullptr);
        loss = out.to(torch::kFloat).pow(2).mean();
      }
      if (c.eval_switch) model->train(c.eval);  // flipped between forward and backward
      loss.backward({}, /*retain_graph=*/c.retain);
      if (c.retain) loss.backward();
      model->train(!c.eval);
      rec.add(at + "loss", loss);
      for (const auto& p : named) rec.add(at + "grad " + p.key(), p.value().grad());
      if (c.x_grad) rec.add(at + "grad input", x.grad());
      opt->step();
      for (const auto& p : named) rec.add(at + "param " + p.key(), p.value());
      for (const auto& b : model->named_buffers()) rec.add(at + "buffer " + b.key(), b.value());
      rec.add(at + "cpu generator state", cpu_rng_state());
      if (g_device.is_cuda())
        rec.add(at + "cuda generator state",
                at::globalContext().defaultGenerator(g_device).get_state());
    }
    if (c.nograd) {
      torch::NoGradGuard no_grad;
      model->eval();
      torch::manual_seed(static_cast<uint64_t>(c.seed) + 17);
      AutocastScope autocast(c.autocast, c.autocast_fp16);
      rec.add("no-grad eval output", model->forward(inputs.back(), nullptr));
    }
    g_offloaded += manager->stats().tensors_offloaded;
    if (observed.counters)
      add_counters(rec, manager->stats(), replays_before, recompose::selective_replay_stats());
  } catch (const std::exception& e) {
    rec.error = e.what();
  }
  // Whatever happened, leave no autocast state behind for the next run.
  at::autocast::clear_cache();
  return rec;
}

void profile_and_apply_plan(const CaseDesc& c, const PlanSpec& spec, rt::diff::RandModelImpl& model,
                            const torch::Tensor& x,
                            const std::shared_ptr<recompose::SwapManager>& manager) {
  torch::optim::SGD stateless(model.parameters(), torch::optim::SGDOptions(0.1));
  auto step = [&] {
    torch::Tensor loss;
    {
      AutocastScope autocast(c.autocast, c.autocast_fp16);
      auto forward = [&](const torch::Tensor& in) { return model.forward(in, nullptr); };
      loss = (spec.enclosed ? recompose::checkpoint(forward, x.clone()) : forward(x.clone()))
                 .to(torch::kFloat)
                 .pow(2)
                 .mean();
    }
    loss.backward();
    if (spec.optimizer_step) stateless.step();
  };
  const auto profile = recompose::profile_memory(model, step);
  // The profile's invariant: an op reads other ops of its own module; it survives JSON.
  for (const auto& m : profile.modules) {
    for (size_t i = 0; i < m.ops.size(); ++i) {
      for (const int64_t r : m.ops[i].reads) {
        if (r < 0 || r >= static_cast<int64_t>(m.ops.size()) || r == static_cast<int64_t>(i))
          throw std::runtime_error("profile: op " + std::to_string(i) + " of module '" + m.name +
                                   "' reads op " + std::to_string(r));
      }
    }
  }
  (void)recompose::MemoryProfile::from_json(profile.to_json());
  const auto options = recompose::SolveOptions().offload(
      spec.offload ? recompose::OffloadMode::Always : recompose::OffloadMode::Auto);
  const int64_t least = recompose::min_plan_bytes(profile, options);
  const auto budget = recompose::Budget::bytes(
      least + static_cast<int64_t>(spec.budget *
                                   std::max(0.0, 1.05 * static_cast<double>(profile.bytes_held) -
                                                     static_cast<double>(least))));
  const recompose::Plan plan =
      spec.plan_memory
          ? recompose::plan_memory(model, step, budget, recompose::PlannerOptions().solve(options))
          : recompose::solve_plan(profile, budget, options);
  recompose::apply_plan(model, plan, recompose::ApplyPlanOptions().swap_manager(manager));
  for (const auto& m : plan.modules)
    g_planned_modules += m.choice != recompose::ModuleChoice::None ? 1 : 0;
}

std::string one_line(std::string s) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

// Compares the records; returns the differences (empty when bitwise equal).
std::vector<std::string> compare(const Record& plain, const Record& ckpt) {
  std::vector<std::string> diffs;
  if (!ckpt.error.empty()) diffs.push_back("exception: " + one_line(ckpt.error));
  const size_t n = std::min(plain.tensors.size(), ckpt.tensors.size());
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, a] = plain.tensors[i];
    const auto& [name_b, b] = ckpt.tensors[i];
    if (name != name_b) {
      diffs.push_back("record order differs: " + name + " vs " + name_b);
      break;
    }
    if (a.defined() != b.defined()) {
      diffs.push_back(name + ": " +
                      (a.defined() ? "undefined with recompose" : "defined only with recompose"));
      continue;
    }
    if (!a.defined()) continue;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
      std::ostringstream s;
      s << name << ": " << a.sizes() << " " << a.scalar_type() << " vs " << b.sizes() << " "
        << b.scalar_type();
      diffs.push_back(s.str());
      continue;
    }
    // Bitwise: NaN equals NaN at the same place (a model may blow up; both runs must agree).
    const bool same = torch::equal(a, b) || (a.is_floating_point() &&
                                             torch::allclose(a, b, 0.0, 0.0, /*equal_nan=*/true));
    if (!same) {
      std::ostringstream s;
      s << name << ": max|d|=";
      if (a.is_floating_point()) {
        s << (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
      } else {
        s << "(" << (a != b).sum().item<int64_t>() << " elements differ)";
      }
      diffs.push_back(s.str());
    }
  }
  if (ckpt.error.empty() && plain.tensors.size() != ckpt.tensors.size()) {
    diffs.push_back("records have " + std::to_string(plain.tensors.size()) + " vs " +
                    std::to_string(ckpt.tensors.size()) + " tensors");
  }
  return diffs;
}

// The kind of the first difference, to group failures in the summary.
std::string category(const std::vector<std::string>& diffs) {
  const std::string& d = diffs.front();
  if (d.rfind("exception: ", 0) == 0) {
    // Numbers (call indices, sizes) would split one kind of error into many.
    std::string out;
    for (char ch : d.substr(0, std::min<size_t>(d.size(), 120))) {
      if (ch >= '0' && ch <= '9') {
        if (out.empty() || out.back() != '#') out += '#';
      } else {
        out += ch;
      }
    }
    return out;
  }
  std::string what = d.substr(0, d.find(':'));
  // drop the step and the parameter's path: "grad", "param", "buffer ...running_mean", "loss", ...
  if (what.rfind("step ", 0) == 0) what = what.substr(what.find(' ', 5) + 1);
  const auto space = what.find(' ');
  if (space != std::string::npos) {
    std::string tail = what.substr(space + 1);
    const auto dot = tail.rfind('.');
    what = what.substr(0, space) + " *" + (dot == std::string::npos ? tail : tail.substr(dot));
  }
  return "first diff: " + what;
}

// A BatchNorm op (of the kinds drawn) in a block whose region, or an enclosing block's, is
// selective (functional segments aside).
bool batch_norm_in_selective_block(const rt::diff::BlockDesc& b, bool in_selective) {
  in_selective = in_selective || b.region.is_sac();
  for (const auto& op : b.ops) {
    if (in_selective && op.kind == rt::diff::OpKind::BatchNorm) return true;
  }
  return std::any_of(b.children.begin(), b.children.end(), [&](const rt::diff::BlockDesc& child) {
    return batch_norm_in_selective_block(child, in_selective);
  });
}

// What the cases drew of issue 48's shapes, so that a run shows it exercised them.
struct DrawCounts {
  int64_t autocast_bn_selective = 0, of_other_kinds = 0, fp16 = 0, twice = 0, back_to_back = 0;
  void add(const CaseDesc& c) {
    bool other_kind = false;
    std::function<void(const rt::diff::BlockDesc&)> visit = [&](const rt::diff::BlockDesc& b) {
      for (const auto& op : b.ops)
        other_kind = other_kind || (op.kind == rt::diff::OpKind::BatchNorm && op.arg != 0);
      for (const auto& child : b.children) visit(child);
    };
    for (const auto& b : c.blocks) visit(b);
    const bool bn_selective = std::any_of(
        c.blocks.begin(), c.blocks.end(),
        [](const rt::diff::BlockDesc& b) { return batch_norm_in_selective_block(b, false); });
    if (c.autocast && bn_selective) {
      ++autocast_bn_selective;
      of_other_kinds += other_kind ? 1 : 0;
      fp16 += c.autocast_fp16 ? 1 : 0;
    }
    twice += std::any_of(c.twice.begin(), c.twice.end(), [](bool t) { return t; }) ? 1 : 0;
    back_to_back += c.back_to_back ? 1 : 0;
  }
  void print(const char* prefix) const {
    std::printf(
        "%s drew: %lld cases with autocast and a BatchNorm in a selective block (%lld with one of "
        "another kind than BatchNorm1d affine tracked, %lld in fp16), %lld with a block applied "
        "twice, %lld with back-to-back regions\n",
        prefix, static_cast<long long>(autocast_bn_selective),
        static_cast<long long>(of_other_kinds), static_cast<long long>(fp16),
        static_cast<long long>(twice), static_cast<long long>(back_to_back));
  }
};

// Runs the differential cases on `device` (CPU, or CUDA with deterministic algorithms).
void run_differential(const c10::Device& device, int64_t default_cases) {
  g_device = device;
  const std::string spec = env_str("RECOMPOSE_DIFF_FEATURES");
  if (spec == "help") {
    for (const auto& [name, what] : Features::all())
      std::printf("  %-18s %s\n", name.c_str(), what.c_str());
    return;
  }
  Features features = Features::parse(spec);
  features.max_ops = static_cast<int>(env_int("RECOMPOSE_DIFF_MAX_OPS", features.max_ops));
  features.max_blocks = static_cast<int>(env_int("RECOMPOSE_DIFF_MAX_BLOCKS", features.max_blocks));
  features.max_depth = static_cast<int>(env_int("RECOMPOSE_DIFF_MAX_DEPTH", features.max_depth));
  int64_t cases = default_cases;
  int64_t first = env_int("RECOMPOSE_DIFF_SEED", 1);
  const int64_t only = env_int("RECOMPOSE_DIFF_ONLY", -1);
  if (only >= 0) {
    first = only;
    cases = 1;
  }
  const bool verbose = env_int("RECOMPOSE_DIFF_VERBOSE", only >= 0 ? 1 : 0) != 0;
  const int64_t max_print = env_int("RECOMPOSE_DIFF_PRINT", 40);

  // Tiny tensors: one thread is fastest and keeps the kernels' reductions in one order.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);

  g_offloaded = 0;
  int64_t failed = 0, invalid = 0;
  std::map<std::string, std::vector<int64_t>> by_category, by_attribution;
  const bool attribute = env_int("RECOMPOSE_DIFF_ATTRIBUTE", only >= 0 ? 1 : 0) != 0;
  DrawCounts drawn;
  for (int64_t seed = first; seed < first + cases; ++seed) {
    const CaseDesc c = rt::diff::generate(static_cast<uint64_t>(seed), features);
    drawn.add(c);
    if (verbose) std::printf("[differential] %s\n", c.str().c_str());
    std::vector<torch::Tensor> inputs;
    torch::manual_seed(static_cast<uint64_t>(seed) + 99991);
    for (int s = 0; s < c.steps; ++s) {
      inputs.push_back(
          (c.seq ? torch::randn({c.batch, c.seq, c.width}) : torch::randn({c.batch, c.width}))
              .to(device));
    }
    const Record plain = run_case(c, false, inputs);
    if (!plain.error.empty()) {
      // The model itself is invalid: a bug of the generator, not of recompose.
      ++invalid;
      std::printf("[differential] INVALID CASE (the plain model threw: %s)\n  %s\n",
                  one_line(plain.error).c_str(), c.str().c_str());
      continue;
    }
    const Record ckpt = run_case(c, true, inputs);
    const auto diffs = compare(plain, ckpt);
    if (diffs.empty()) continue;
    ++failed;
    by_category[category(diffs)].push_back(seed);
    std::string attribution;
    if (attribute) {
      // Rerun with each known-buggy feature switched off alone (the rest of the case stays the
      // same, see Gen in random_model.cpp): which switches make it pass?
      for (const auto& name : Features::known()) {
        if (!features(name)) continue;
        Features off = features;
        off.on[name] = false;
        const CaseDesc variant = rt::diff::generate(static_cast<uint64_t>(seed), off);
        if (compare(run_case(variant, false, inputs), run_case(variant, true, inputs)).empty()) {
          attribution += (attribution.empty() ? "-" : ",-") + name;
        }
      }
      if (attribution.empty()) {
        // Several known bugs at once, or one nobody knew of?
        Features off = features;
        for (const auto& name : Features::known()) off.on[name] = false;
        const CaseDesc variant = rt::diff::generate(static_cast<uint64_t>(seed), off);
        const bool passes =
            compare(run_case(variant, false, inputs), run_case(variant, true, inputs)).empty();
        attribution = passes ? "-known only (several known bugs)"
                             : "NOTHING KNOWN (fails with -known: a new bug)";
      }
      by_attribution[attribution].push_back(seed);
    }
    if (failed <= max_print) {
      std::printf("[differential] FAIL %s\n", c.str().c_str());
      for (size_t i = 0; i < diffs.size() && i < 4; ++i) std::printf("    %s\n", diffs[i].c_str());
      if (diffs.size() > 4) std::printf("    ... %zu differences in all\n", diffs.size());
      if (attribute) {
        std::printf("    passes with: %s\n", attribution.c_str());
      }
    }
  }
  at::set_num_threads(threads);

  std::printf(
      "[differential] %s: %lld cases (seeds %lld..%lld), features %s: %lld failed, %lld invalid"
      " (%lld tensors swapped)\n",
      device.str().c_str(), static_cast<long long>(cases), static_cast<long long>(first),
      static_cast<long long>(first + cases - 1), features.str().c_str(),
      static_cast<long long>(failed), static_cast<long long>(invalid),
      static_cast<long long>(g_offloaded));
  drawn.print("[differential]");
  for (const auto& [what, seeds] : by_category) {
    std::printf("[differential]   %4zu x %s  (seeds", seeds.size(), what.c_str());
    for (size_t i = 0; i < seeds.size() && i < 8; ++i)
      std::printf(" %lld", static_cast<long long>(seeds[i]));
    std::printf("%s)\n", seeds.size() > 8 ? " ..." : "");
  }
  for (const auto& [what, seeds] : by_attribution) {
    std::printf("[differential]   %4zu x passes with %s  (seeds", seeds.size(), what.c_str());
    for (size_t i = 0; i < seeds.size() && i < 8; ++i)
      std::printf(" %lld", static_cast<long long>(seeds[i]));
    std::printf("%s)\n", seeds.size() > 8 ? " ..." : "");
  }
  std::fflush(stdout);
  CHECK_MESSAGE(invalid == 0, "the generator built models that fail without recompose");
  const std::string verdict =
      std::to_string(failed) + " of " + std::to_string(cases) +
      " cases differ with recompose; rerun one with RECOMPOSE_DIFF_ONLY=<seed>";
  CHECK_MESSAGE(failed == 0, doctest::String(verdict.c_str()));
  g_device = c10::Device(c10::kCPU);
}

// The planner on random models: each case trains twice from the same start, once plain and once
// profiled (profile_memory, and plan_memory in half the cases) at some step and trained under the
// plan from there on. Both must agree bitwise, the eval output after training included: profiling
// leaves the model as it found it, and a plan changes nothing that training computes.
// RECOMPOSE_DIFF_PLAN_CASES=N cases (default 300), from RECOMPOSE_DIFF_SEED; RECOMPOSE_DIFF_ONLY
// and RECOMPOSE_DIFF_FEATURES as above (retain_graph is left out: plans may hold selective
// regions).
void run_planned_differential(int64_t default_cases) {
  Features features = Features::parse(env_str("RECOMPOSE_DIFF_FEATURES"));
  features.on["retain"] = false;
  int64_t cases = env_int("RECOMPOSE_DIFF_PLAN_CASES", default_cases);
  int64_t first = env_int("RECOMPOSE_DIFF_SEED", 1);
  if (const int64_t only = env_int("RECOMPOSE_DIFF_ONLY", -1); only >= 0) first = only, cases = 1;
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  int64_t failed = 0;
  g_planned_modules = 0;
  DrawCounts drawn;
  for (int64_t seed = first; seed < first + cases; ++seed) {
    CaseDesc c = rt::diff::generate(static_cast<uint64_t>(seed), features);
    drawn.add(c);
    c.nograd = true;  // the eval output after training is compared too
    const PlanSpec spec = plan_spec(static_cast<uint64_t>(seed), c.steps);
    std::vector<torch::Tensor> inputs;
    torch::manual_seed(static_cast<uint64_t>(seed) + 99991);
    for (int s = 0; s < c.steps; ++s) {
      inputs.push_back(c.seq ? torch::randn({c.batch, c.seq, c.width})
                             : torch::randn({c.batch, c.width}));
    }
    const Record plain = run_case(c, false, inputs);
    if (!plain.error.empty()) continue;  // an invalid model: the plain differential reports it
    const Record planned = run_case(c, false, inputs, &spec);
    const auto diffs = compare(plain, planned);
    if (diffs.empty()) continue;
    if (++failed <= 20) {
      std::printf("[planned differential] FAIL %s %s\n", spec.str().c_str(), c.str().c_str());
      for (size_t i = 0; i < diffs.size() && i < 4; ++i) std::printf("    %s\n", diffs[i].c_str());
    }
  }
  at::set_num_threads(threads);
  std::printf(
      "[planned differential] %lld cases (seeds %lld..%lld): %lld failed (%lld modules "
      "checkpointed or "
      "offloaded by the plans)\n",
      static_cast<long long>(cases), static_cast<long long>(first),
      static_cast<long long>(first + cases - 1), static_cast<long long>(failed),
      static_cast<long long>(g_planned_modules));
  drawn.print("[planned differential]");
  std::fflush(stdout);
  const std::string verdict =
      std::to_string(failed) + " of " + std::to_string(cases) +
      " planned cases differ from plain training; rerun one with RECOMPOSE_DIFF_ONLY=<seed>";
  CHECK_MESSAGE(failed == 0, doctest::String(verdict.c_str()));
  CHECK(g_planned_modules > 0);
}

// Sinks change nothing: each case trains with recompose twice, once with nothing listening and
// once with a StepLedger and the memory history (memory_viz's snapshot sink) listening; the
// losses, gradients, parameters, buffers and generators must agree bitwise, and so must the
// counters (SwapStats, SelectiveReplayStats), field by field: the facts they count are counted
// where they are emitted, whoever listens (Note [ Events and sinks ]).
// RECOMPOSE_DIFF_SINK_CASES=N cases (default 150), from RECOMPOSE_DIFF_SEED.
void run_listening_differential(int64_t default_cases) {
  const Features features = Features::parse(env_str("RECOMPOSE_DIFF_FEATURES"));
  const int64_t cases = env_int("RECOMPOSE_DIFF_SINK_CASES", default_cases);
  const int64_t first = env_int("RECOMPOSE_DIFF_SEED", 1);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  int64_t failed = 0, counted = 0, swapped = 0, replayed = 0;
  for (int64_t seed = first; seed < first + cases; ++seed) {
    const CaseDesc c = rt::diff::generate(static_cast<uint64_t>(seed), features);
    std::vector<torch::Tensor> inputs;
    torch::manual_seed(static_cast<uint64_t>(seed) + 99991);
    for (int s = 0; s < c.steps; ++s) {
      inputs.push_back(c.seq ? torch::randn({c.batch, c.seq, c.width})
                             : torch::randn({c.batch, c.width}));
    }
    const Record quiet = run_case(c, true, inputs, nullptr, {.counters = true});
    if (!quiet.error.empty()) continue;  // invalid or failing: the main differential reports it
    const Record heard = run_case(c, true, inputs, nullptr, {.counters = true, .listening = true});
    ++counted;
    for (const auto& [name, t] : quiet.tensors) {
      if (name == "counter swap tensors_offloaded") swapped += t.item<int64_t>();
      if (name == "counter replay replayed") replayed += t.item<int64_t>();
    }
    const auto diffs = compare(quiet, heard);
    if (diffs.empty()) continue;
    if (++failed <= 10) {
      std::printf("[listening differential] FAIL %s\n", c.str().c_str());
      for (size_t i = 0; i < diffs.size() && i < 4; ++i) std::printf("    %s\n", diffs[i].c_str());
    }
  }
  at::set_num_threads(threads);
  std::printf(
      "[listening differential] %lld cases (seeds %lld..%lld), %lld valid: %lld differ with the "
      "sinks listening (%lld tensors swapped, %lld regions replayed, counted in both runs)\n",
      static_cast<long long>(cases), static_cast<long long>(first),
      static_cast<long long>(first + cases - 1), static_cast<long long>(counted),
      static_cast<long long>(failed), static_cast<long long>(swapped),
      static_cast<long long>(replayed));
  std::fflush(stdout);
  CHECK(failed == 0);
  CHECK(swapped > 0);   // the swap counters were exercised
  CHECK(replayed > 0);  // and the replay's
}

bool cuda_here() {
  static const bool yes = torch::cuda::is_available();
  return yes;
}

}  // namespace

TEST_SUITE("differential") {
  TEST_CASE("differential: random models train bitwise the same with and without recompose") {
    run_differential(c10::Device(c10::kCPU), env_int("RECOMPOSE_DIFF_CASES", 500));
  }

  TEST_CASE(
      "differential: random models profiled, planned and trained under the plan train bitwise as "
      "never profiled") {
    run_planned_differential(300);
  }

  TEST_CASE(
      "differential: sinks listening change neither training nor the counters, field by field") {
    run_listening_differential(150);
  }

}  // TEST_SUITE

TEST_SUITE("cuda" * doctest::skip(!cuda_here())) {
  TEST_CASE(
      "cuda differential: random models on CUDA train bitwise the same with and without "
      "recompose") {
    rt::DeterministicCuda deterministic;
    run_differential(c10::Device(c10::kCUDA, 0), env_int("RECOMPOSE_DIFF_CUDA_CASES", 300));
  }

}  // TEST_SUITE
