// profile_memory(): two instrumented runs of a training step (recompose/memory_profile.h), each
// from the model as the caller left it: run_plain (bytes saved, forward, backward and step times,
// what the device held beside the activations), then run_intercepted (ops, their outputs and
// times, recomputation times); then run_timed, the step without the meter, for the step's and
// the modules' forward and backward times.
#include "backward_spans.h"
#include "engine/model_state_guard.h"
#include "engine/tensor_accounting.h"
#include "model_device.h"
#include "op_times.h"
#include "planner_targets.h"
#include "selective/op_traits.h"
#include "selective/policy_warnings.h"
#include "selective/summarizing_contexts.h"
#include "step_timeline.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint_error.h>
#include <recompose/checkpoint_state.h>
#include <recompose/device_memory.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/memory_profile.h>
#include <recompose/saved_tensor_meter.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace recompose {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Frame {
  size_t module;
  detail::StepTimeline::Mark start;
  int64_t bytes_at_start = 0;
  bool recomputing = false;
  size_t call = 0;  // BackwardSpans id
  // Run 1: the inputs nothing held when the call began (if its forward saves one, it owns it).
  std::vector<at::Tensor> unheld_inputs;
};

void add_once(std::vector<int64_t>& list, int64_t value) {
  if (std::find(list.begin(), list.end(), value) == list.end())
    list.insert(std::upper_bound(list.begin(), list.end(), value), value);
}

// Hooks on the gradients of `tensors` (those that need one and are not autograd leaves), each
// telling `rec` that call `call`'s output (input) gradient is ready. They live on the step's
// graph, so they go with it; a weak reference, so a graph kept past the profile does nothing.
template <class Rec>
void watch_gradients(const std::vector<at::Tensor>& tensors, const std::shared_ptr<Rec>& rec,
                     size_t call, bool output) {
  if (!at::GradMode::is_enabled()) return;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.requires_grad() || t.is_leaf()) continue;
    std::weak_ptr<Rec> weak = rec;
    t.register_hook([weak, call, output](const at::Tensor&) {
      if (auto r = weak.lock()) output ? r->spans.output_ready(call) : r->spans.input_ready(call);
    });
  }
}

// What the hooks and the logging policy of both runs record into.
struct Recorder : std::enable_shared_from_this<Recorder> {
  detail::StepTimeline timeline;
  detail::BackwardSpans spans{timeline};
  int run = 1;
  const SavedTensorMeter* meter = nullptr;
  std::vector<Frame> frames;
  detail::StepTimeline::Mark last = 0;  // end of the previous thing timed in a module's forward
  std::vector<ModuleProfile> modules;
  std::vector<std::map<std::pair<std::string, int64_t>, size_t>> op_index;
  // Run 2, per module: the summaries of its regions' forwards received, those that could not be
  // made, and per op whether a later op wrote into its output without its kept output carrying
  // the write (then keeping it needs a copy).
  std::vector<int64_t> calls_summarized, summaries_failed;
  std::vector<std::vector<bool>> written_uncarried;
  // Run 2, per module and op: the seconds of the draws kept as bits within the op's span (host
  // clock only). See Note [ A kept draw is no op's recomputation ] (op_times.cpp).
  std::vector<std::vector<double>> draws_in_span;
  // Run 1: an input storage a module's forward saved -> that module. A later module taking the
  // same storage as input does not count it (ModuleProfile::shared_input_bytes).
  std::unordered_map<const c10::StorageImpl*, size_t> input_owner;
  std::set<const c10::StorageImpl*> shared_counted;

  explicit Recorder(const c10::Device& device) : timeline(device) {}

  void enter(size_t m, const hooks::ForwardCall& call) {
    Frame f{m, {}, 0, is_recomputing(), 0, {}};
    if (!f.recomputing) {
      f.call = spans.add_call(m);
      watch_gradients(call.input_leaves(), shared_from_this(), f.call, /*output=*/false);
    }
    // A recomputation inside backward (the step's own checkpointing, checkpoint_sequential's
    // segments) is no call of the step's forward: it is counted and recorded by no run.
    if (run == 1 && !f.recomputing) {
      modules[m].calls += 1;
      std::vector<c10::IValue> inputs;
      for (const auto& t : call.input_leaves()) {
        if (t.defined() && t.has_storage()) {
          const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
          auto owner = input_owner.find(st);
          if (owner != input_owner.end() && owner->second != m) {
            // An earlier module's input, saved by its forward: counted there, whatever it holds.
            if (shared_counted.insert(st).second)
              modules[owner->second].shared_input_bytes +=
                  static_cast<int64_t>(t.storage().nbytes());
            continue;
          }
          if (!meter->holds(t)) f.unheld_inputs.push_back(t);
        }
        inputs.emplace_back(t);
      }
      modules[m].input_bytes +=
          detail::distinct_storage_bytes(inputs, /*skip_parameter_like=*/true);
      f.bytes_at_start = meter->bytes_held();
    }
    frames.push_back(f);
    frames.back().start = last = timeline.mark();
  }

  void leave(size_t m, const hooks::ForwardCall& call) {
    if (frames.empty() || frames.back().module != m)
      return;  // unbalanced: a hook was added mid-call
    const Frame f = frames.back();
    frames.pop_back();
    const auto end = timeline.mark();
    if (!f.recomputing && call.has_output())
      watch_gradients(call.output_leaves(), shared_from_this(), f.call, true);
    ModuleProfile& p = modules[m];
    if (run == 3) {  // the timed run: forward times only
      if (f.recomputing) return;
      timeline.add(f.start, end, [this, m]() -> double& { return modules[m].forward_seconds; });
    } else if (run == 1) {
      if (f.recomputing) return;
      p.saved_bytes += meter->bytes_held() - f.bytes_at_start;
      for (const at::Tensor& t : f.unheld_inputs) {
        if (meter->holds(t)) input_owner.try_emplace(t.storage().unsafeGetStorageImpl(), m);
      }
    } else if (f.recomputing) {
      timeline.add(f.start, end, [this, m]() -> double& { return modules[m].replay_seconds; });
    } else {
      timeline.add(f.start, end,
                   [this, m]() -> double& { return modules[m].selective_forward_seconds; });
    }
  }

  // Run 2: what one forward call of module m did, from its region's trace (the ops were added by
  // record(), keyed by (op, call index); a module called several times merges its calls by that
  // key).
  void absorb(size_t m, const detail::ForwardSummary& summary) {
    if (is_recomputing()) return;  // a region inside a recomputation: its forward was recorded
    if (summary.failed) {
      summaries_failed[m] += 1;
      return;
    }
    calls_summarized[m] += 1;
    for (const detail::SummaryOp& op : summary.ops) modules[m].draw_bytes += op.draw_bytes;
    // Each summary entry's op in the profile (-1: none), first: a read may name a later entry.
    std::vector<int64_t> index_of(summary.ops.size(), -1);
    for (size_t e = 0; e < summary.ops.size(); ++e) {
      const detail::SummaryOp& op = summary.ops[e];
      if (op.kind != detail::SummaryOp::Kind::Decided) continue;
      auto it = op_index[m].find({detail::overload_name(op.op), op.call_index});
      if (it != op_index[m].end()) index_of[e] = static_cast<int64_t>(it->second);
    }
    note_draws(m, summary, index_of);
    for (size_t e = 0; e < summary.ops.size(); ++e) {
      const detail::SummaryOp& op = summary.ops[e];
      const int64_t index = index_of[e];
      if (index < 0) continue;
      OpProfile& o = modules[m].ops[static_cast<size_t>(index)];
      o.output_bytes += op.output_bytes;
      for (const uint32_t r : op.reads) {
        if (index_of[r] >= 0 && index_of[r] != index) add_once(o.reads, index_of[r]);
      }
      o.saved_for_backward = o.saved_for_backward || op.saved_for_backward;
      if (op.written_after) {
        o.mutated = true;
        if (!op.carries_writes) written_uncarried[m][static_cast<size_t>(index)] = true;
      }
    }
  }

  // Device spans are events, not the host clock: no draw is taken out of them.
  void note_draws(size_t m, const detail::ForwardSummary& summary,
                  const std::vector<int64_t>& index_of) {
    if (timeline.on_host()) detail::add_draws_in_spans(summary, index_of, draws_in_span[m]);
  }

  CheckpointPolicy record(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op) {
    // Outside the profiled modules, or a region running its forward again inside a recomputation
    // of an enclosing one (checkpoint_sequential's segments): nothing to record, its ops are the
    // forward call's, recorded then.
    if (frames.empty() || frames.back().recomputing) return CheckpointPolicy::MUST_SAVE;
    const auto now = timeline.mark();
    const size_t m = frames.back().module;
    auto key = std::make_pair(detail::overload_name(op), ctx.call_index);
    auto [it, fresh] = op_index[m].try_emplace(key, modules[m].ops.size());
    if (fresh) {
      OpProfile o;
      o.op = key.first;
      o.call_index = key.second;
      const detail::OpTraits& traits = detail::OpTraits::of(op);
      o.random = traits.random;
      o.inplace = traits.writes_argument;
      o.view = traits.returns_unwritten_alias;
      modules[m].ops.push_back(std::move(o));
      written_uncarried[m].push_back(false);
    }
    const size_t index = it->second;
    timeline.add(last, now,
                 [this, m, index]() -> double& { return modules[m].ops[index].seconds; });
    // Its output bytes, what it reads, whether autograd saves it and whether a later op writes
    // into it: from the region's trace when the call's forward ends (absorb).
    last = timeline.mark();  // the policy's own bookkeeping is not the op's time
    return CheckpointPolicy::MUST_SAVE;
  }
};

// Hooks and checkpointing the profile attached; removed on every exit.
struct Instrumentation {
  std::vector<hooks::HookHandle> handles;
  std::vector<torch::nn::Module*> checkpointed;
  void remove_checkpoints() {
    for (auto* m : checkpointed) remove_checkpoint(*m);
    checkpointed.clear();
  }
  ~Instrumentation() {
    for (auto& h : handles) h.remove();
    remove_checkpoints();
  }
};

// 16 MiB each way, best of three: long enough that a copy's launch is noise at ~50 GB/s, short
// enough that allocating the pinned buffer (a first cudaHostAlloc) and the copies cost a few ms
// of the profile rather than tens.
double measure_copy_bandwidth(const torch::Device& device) {
  const int64_t n = int64_t{16} << 20;
  auto on_device = torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  auto host = torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  host.copy_(on_device);  // warm-up
  auto best = [&](auto copy) {
    double fastest = INFINITY;
    for (int i = 0; i < 3; ++i) {
      torch::cuda::synchronize();
      const auto t0 = Clock::now();
      copy();
      torch::cuda::synchronize();
      fastest = std::min(fastest, seconds_since(t0));
    }
    return fastest;
  };
  const double d2h = best([&] { host.copy_(on_device, /*non_blocking=*/true); });
  const double h2d = best([&] { on_device.copy_(host, /*non_blocking=*/true); });
  return static_cast<double>(n) / std::max({d2h, h2d, 1e-9});
}

// The modules to profile; none may carry a recompose API already.
std::vector<detail::PlannerTarget> profiled_modules(torch::nn::Module& model,
                                                    const ProfileOptions& options) {
  auto targets = detail::planner_targets(model, options.modules());
  for (const auto& t : targets) {
    for (const auto& api : hooks::applied_apis(*t.module)) {
      if (api.starts_with("recompose.")) {
        throw CheckpointError(
            "recompose: profile_memory: module '" + t.name + "' already has " + api +
            " attached; remove it (remove_checkpoint, remove_offload or remove_plan) first");
      }
    }
  }
  return targets;
}

std::shared_ptr<Recorder> make_recorder(const std::vector<detail::PlannerTarget>& targets,
                                        const torch::Device& device) {
  auto rec = std::make_shared<Recorder>(device);
  rec->modules.resize(targets.size());
  rec->op_index.resize(targets.size());
  rec->calls_summarized.resize(targets.size());
  rec->summaries_failed.resize(targets.size());
  rec->written_uncarried.resize(targets.size());
  rec->draws_in_span.resize(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    rec->modules[i].name = targets[i].name;
    rec->modules[i].type = targets[i].module->name();
  }
  return rec;
}

void attach_timing_hooks(Instrumentation& inst, const std::vector<detail::PlannerTarget>& targets,
                         const std::shared_ptr<Recorder>& rec) {
  const auto owner = hooks::HookOptions().owner("recompose.planner.profile");
  for (size_t i = 0; i < targets.size(); ++i) {
    inst.handles.push_back(hooks::register_forward_pre_hook(
        *targets[i].module, [rec, i](hooks::ForwardCall& call) { rec->enter(i, call); }, owner));
    inst.handles.push_back(hooks::register_forward_hook(
        *targets[i].module, [rec, i](hooks::ForwardCall& call) { rec->leave(i, call); },
        hooks::HookOptions(owner).always_call(true)));
  }
}

// Off CUDA no allocator peak is measured: the model's own tensors as the step left them
// (parameters, their gradients, buffers), each storage once. A lower bound of what the device
// would hold beside the activations: optimizer state and temporaries are not counted.
int64_t model_tensor_bytes(torch::nn::Module& model) {
  std::set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.has_storage() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const auto& p : model.parameters()) {
    add(p);
    add(p.grad());
  }
  for (const auto& b : model.buffers()) add(b);
  return bytes;
}

// Run 1: no checkpointing. What each module saves and what the device holds beside (its times
// are run 3's to take: the meter slows this run).
void run_plain(const std::function<void()>& step, const std::vector<detail::PlannerTarget>& targets,
               const std::shared_ptr<Recorder>& rec, torch::nn::Module& model,
               const torch::Device& device, MemoryProfile& profile) {
  Instrumentation inst;
  attach_timing_hooks(inst, targets, rec);
  SavedTensorMeter meter;
  rec->meter = &meter;
  reset_peak_device_memory(device);
  step();
  (void)rec->spans.take(rec->timeline.mark());  // its backward spans: run 3 times them
  rec->timeline.resolve();
  profile.bytes_held = meter.peak_bytes_held();
  // What the device held beside the activations at the step's peak (a peak budget's base). On
  // CPU, even with CpuMemoryCounting on, the counted peak would include the profiler's own copy
  // of the model (ModelStateGuard keeps it in host memory): the model's tensors instead.
  const int64_t peak = device.is_cpu() ? -1 : peak_device_memory(device);
  profile.resident_bytes =
      peak >= 0 ? std::max<int64_t>(0, peak - profile.bytes_held) : model_tensor_bytes(model);
  rec->meter = nullptr;
}

// Run 3: the step without checkpointing and without run 1's meter, whose hooks on every saved
// tensor make a step slower than a real one (on CPU by 10-15%; issue 44): the step's time and
// each module's forward and backward times (only the light forward hooks and gradient hooks of
// the timeline stay). Run 1 measured what each module saves; run 2 warmed the ops up.
void run_timed(const std::function<void()>& step, const std::vector<detail::PlannerTarget>& targets,
               const std::shared_ptr<Recorder>& rec, MemoryProfile& profile) {
  Instrumentation inst;
  rec->run = 3;
  attach_timing_hooks(inst, targets, rec);
  const auto t0 = rec->timeline.mark();
  step();
  const auto t1 = rec->timeline.mark();
  rec->timeline.add(t0, t1, [&profile]() -> double& { return profile.step_seconds; });
  Recorder* r = rec.get();
  for (const auto& s : rec->spans.take(t1)) {
    rec->timeline.add(s.from, s.to,
                      [r, m = s.module]() -> double& { return r->modules[m].backward_seconds; });
  }
  rec->timeline.resolve();
}

void check_plain_run(const MemoryProfile& profile, const Recorder& rec) {
  if (profile.bytes_held == 0) {
    throw CheckpointError(
        "recompose: profile_memory: the step saved nothing for backward (is grad mode on, and does "
        "the "
        "step run a forward of the model whose result needs gradients?)");
  }
  for (const auto& m : rec.modules) {
    if (m.calls == 0) {
      throw CheckpointError("recompose: profile_memory: the step never called module '" + m.name +
                            "' (" + m.type + ")");
    }
  }
}

// Run 2: every module checkpointed, every op kept (nothing recomputed, nothing changes): the ops,
// their outputs and times; backward times each module's recomputation as training will run it:
// a selective replay (no module code runs: its time is the replay counters' between the module's
// backward hooks), or, where the region cannot replay or replay is off, its forward again (timed
// by the forward hooks, which see it recomputing). Timing hooks go after apply_checkpoint's so
// that the region's setup is not the first op's time.
void run_intercepted(const std::function<void()>& step,
                     const std::vector<detail::PlannerTarget>& targets,
                     const std::shared_ptr<Recorder>& rec) {
  Instrumentation inst;
  rec->run = 2;
  SelectivePolicy keep_all([rec](const SelectiveCheckpointContext& ctx,
                                 const c10::OperatorHandle& op,
                                 const torch::jit::Stack&) { return rec->record(ctx, op); });
  for (size_t i = 0; i < targets.size(); ++i) {
    // allow_cache_entry_mutation: an op whose output the forward later modifies is marked, not an
    // error. The region's trace tells the recorder what each forward call did (absorb).
    auto contexts = [keep_all, rec, i]() -> std::shared_ptr<RegionContexts> {
      return detail::create_summarizing_contexts(
          keep_all, true, [rec, i](detail::ForwardSummary&& s) { rec->absorb(i, s); });
    };
    apply_checkpoint(*targets[i].module, CheckpointOptions().context_fn(contexts));
    inst.checkpointed.push_back(targets[i].module.get());
  }
  attach_timing_hooks(inst, targets, rec);
  {
    // The keep-all policy is the profiler's, not the user's: its warnings would be noise, and
    // each would use up one of the few a process gives (the user's own policies then go unwarned).
    detail::PolicyWarningsOff quiet;
    step();
  }
  const auto end = rec->timeline.mark();
  std::vector<int64_t> replays(targets.size(), 0), fallbacks(targets.size(), 0);
  for (const auto& s : rec->spans.take(end)) {
    replays[s.module] += s.replayed;
    fallbacks[s.module] += s.fallbacks;
    rec->modules[s.module].replay_seconds += static_cast<double>(s.replay_ns) * 1e-9;
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    ModuleProfile& m = rec->modules[i];
    m.replayed = replays[i] > 0 && fallbacks[i] == 0;
    // Every region's forward summarised (one that could not be made, out of host memory, leaves
    // the module charged every op it does not keep); a call without a region (grad mode off)
    // makes none.
    m.dependencies_recorded = rec->calls_summarized[i] > 0 && rec->summaries_failed[i] == 0;
    for (size_t k = 0; k < m.ops.size(); ++k)
      m.ops[k].carries_write = m.ops[k].mutated && !rec->written_uncarried[i][k];
  }
  rec->timeline.resolve();
}

}  // namespace

MemoryProfile profile_memory(torch::nn::Module& model, const std::function<void()>& step,
                             const ProfileOptions& options) {
  if (!step) throw std::invalid_argument("recompose: profile_memory: the step function is empty");
  if (options.timed_steps() < 1)
    throw std::invalid_argument("recompose: profile_memory: timed_steps must be at least 1");
  const auto t_begin = Clock::now();
  const auto targets = profiled_modules(model, options);
  const torch::Device device = detail::device_of(model);
  const auto rec = make_recorder(targets, device);
  MemoryProfile profile;
  profile.device = device.str();
  {
    // Each run starts from the model as the caller left it, and so does the training that follows
    // (restored here after each run, by the guard on an exception; each run removes its hooks
    // first).
    detail::ModelStateGuard model_state(model, device);
    run_plain(step, targets, rec, model, device, profile);
    model_state.restore();
    check_plain_run(profile, *rec);
    run_intercepted(step, targets, rec);
    model_state.restore();
    // Each time the least over the timed runs: noise (a preempted thread, a busy neighbour) only
    // ever adds time.
    std::vector<std::pair<double, double>> least(rec->modules.size(), {INFINITY, INFINITY});
    double least_step = INFINITY;
    for (int64_t k = 0; k < options.timed_steps(); ++k) {
      for (auto& m : rec->modules) m.forward_seconds = m.backward_seconds = 0;
      profile.step_seconds = 0;
      run_timed(step, targets, rec, profile);
      model_state.restore();
      least_step = std::min(least_step, profile.step_seconds);
      for (size_t i = 0; i < least.size(); ++i) {
        least[i].first = std::min(least[i].first, rec->modules[i].forward_seconds);
        least[i].second = std::min(least[i].second, rec->modules[i].backward_seconds);
      }
    }
    profile.step_seconds = least_step;
    for (size_t i = 0; i < least.size(); ++i)
      std::tie(rec->modules[i].forward_seconds, rec->modules[i].backward_seconds) = least[i];
  }
  for (size_t i = 0; i < rec->modules.size(); ++i)
    detail::settle_op_times(rec->modules[i], rec->draws_in_span[i]);
  int64_t module_bytes = 0;
  for (const auto& m : rec->modules) module_bytes += m.saved_bytes;
  profile.other_bytes = std::max<int64_t>(0, profile.bytes_held - module_bytes);
  profile.modules = std::move(rec->modules);
  if (device.is_cuda() && options.measure_bandwidth())
    profile.copy_bandwidth = measure_copy_bandwidth(device);
  profile.profile_seconds = seconds_since(t_begin);
  return profile;
}

}  // namespace recompose
