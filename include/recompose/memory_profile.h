// The profile of one training step that the memory-budget planner solves on (recompose/planner.h):
// per checkpointable module, the bytes it holds for backward without checkpointing and under full
// checkpointing (its inputs), its forward time, and per op of its forward the bytes that keeping
// the op's outputs would hold and the op's measured time. A profile is a value: print it, save it
// as JSON, load it and solve on it again without running the model.
//
//   auto step = [&] { model->forward(x).sum().backward(); };   // forward + backward, no optimizer
//   recompose::MemoryProfile profile = recompose::profile_memory(*model, step);
//   std::cout << profile.to_string();
//   profile.save("profile.json");
//
// How it is taken: `step` runs three times (the third again for each further
// ProfileOptions::timed_steps). The first run is plain (no checkpointing): a
// SavedTensorMeter measures what each module call adds to the bytes held for backward. The second
// run checkpoints every module with a selective policy that keeps
// every op's output (so nothing is recomputed and nothing changes numerically): the policy, asked
// after each op ran, records the op, the bytes of its outputs and the time since the previous op
// (which includes the views and in-place ops the policy does not see, and autograd's bookkeeping:
// what recomputing the op costs); each region's forward trace then tells which ops' outputs it
// reads, whether autograd saves its output and whether a later op writes into it (what a
// selective replay runs for a keep set follows from them). The backward of the
// second run times each module's recomputation as training will run it (selective
// checkpointing's fixed cost): the selective replay where the region replays
// (selective_replay_enabled(), the default; the replay's time from selective_replay_stats()), else
// its forward run again. The third run is plain again, without the meter (whose hook on every
// saved tensor slows a step: on CPU by 10-15%): its time is the profile's step_seconds, and it
// times each module's forward and its backward, from the gradient of its output to those of its
// inputs.
//
// The model is left exactly as it was found, and each run starts from it: after each run (and when
// `step` throws) the parameters' and buffers' values (BatchNorm's running statistics and counter
// included) are written back, bitwise, into the same tensors; each parameter's .grad is what it
// was (none stays none; a defined one is the same tensor with the same values); every module's
// train/eval mode, the CPU generator and the model's device generator are put back; the hooks and
// checkpointing the profiler attached are removed (a user's own stay). So the training that
// follows is bitwise the training of a model never profiled. `step` may step an optimizer: the
// parameters are put back, but the optimizer's own state (momentum, Adam's moments and step
// count) is outside the model and keeps two more steps: profile with a step that does not step a
// stateful optimizer. Profiling holds one copy of the parameters, buffers and gradients.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace recompose {

/// One op of a module's forward, as selective checkpointing sees it (views, in-place and out= ops
/// are always recomputed and never shown to a policy; their time goes to the next op shown, but
/// for a draw a replay writes back from its kept bits, dropout's bernoulli_ on CPU).
///
/// Example:
/// ```
/// for (const auto& op : profile.modules[0].ops)
///   std::printf("%s #%lld: %lld bytes, %.3f ms\n", op.op.c_str(),
///               static_cast<long long>(op.call_index), static_cast<long long>(op.output_bytes),
///               op.seconds * 1e3);
/// ```
struct OpProfile {
  std::string op;  ///< overload, as "aten::mm.default"
  /// How many calls of this overload came before it in the module's forward.
  int64_t call_index = 0;
  int64_t output_bytes = 0;  ///< bytes that keeping its outputs holds (distinct storages)
  /// Measured forward time, summed over the module's calls in the step; the module's ops scaled
  /// to sum to at most its plain forward_seconds (Note [ Op times scaled to the plain forward ],
  /// lib/planner/op_times.cpp: their measurement carries the profiler's recording), less the
  /// draws a replay does not run (Note [ A kept draw is no op's recomputation ], same file).
  double seconds = 0;
  bool random = false;   ///< draws random numbers (nondeterministic_seeded, or takes a Generator)
  bool inplace = false;  ///< writes into an argument (never true for an op a policy sees)
  bool view = false;     ///< returns a view of an argument (never true for an op a policy sees)
  bool mutated = false;  ///< its output's storage was modified in place later in the forward
  /// Of a mutated op, were it the only op kept: its kept output would carry every write into it
  /// (docs/architecture.md, "Writes carried by kept outputs"): it made the storage written (not
  /// an alias of another op's output, as _unsafe_view's of mm's), draws no random numbers, each
  /// write is in place into one argument and draws none, and nothing made a value from the
  /// output or saved it for backward before each write. Keeping it then costs no copy, so it may
  /// be kept; otherwise keeping it would need a copy of the value before the write: never kept.
  bool carries_write = false;
  /// What the selective replay's dependency walk needs (recorded when
  /// ModuleProfile::dependencies_recorded; a replay runs a dropped op only when backward needs its
  /// output). `reads`: indices in ModuleProfile::ops of the ops of the same forward call whose
  /// outputs this op reads (by storage: a view reads its base; a read after an in-place write
  /// reads the producer's output), and of those that the in-place writes into its own output read
  /// (a replay running this op runs them too; they may come after it), ascending, each once,
  /// never the op itself.
  std::vector<int64_t> reads = {};
  /// Autograd saves a tensor of its output (any view or version of it) in the module's forward.
  bool saved_for_backward = false;
};

/// One checkpointable module (a module whose forward carries RECOMPOSE_FORWARD).
/// Times: on CPU host time; on a device the device's time between events recorded on the
/// current stream (no synchronisation per op, so the profiled step runs as a step runs).
///
/// Example:
/// ```
/// for (const auto& m : profile.modules)
///   std::cout << m.name << ": " << m.saved_bytes << " bytes saved, " << m.input_bytes
///             << " under full checkpointing\n";
/// ```
struct ModuleProfile {
  std::string name;   ///< path from the profiled root ("blocks.0"); "" for the root itself
  std::string type;   ///< torch::nn::Module::name() of the module
  int64_t calls = 0;  ///< forward calls in one step
  int64_t input_bytes =
      0;  ///< held under full checkpointing: its tensor inputs (not leaves requiring grad)
  /// Of input_bytes, the inputs that later modules take too (a tensor fanned out, as an FPN's
  /// encoder features or a U-Net's skips) and that this module's forward saves: counted here
  /// only, not in the later modules' input_bytes, and held on the device whatever this module's
  /// choice (offloading it moves no device memory while a later module holds it).
  int64_t shared_input_bytes = 0;
  /// Held without checkpointing: what autograd saves during its forward.
  int64_t saved_bytes = 0;
  double forward_seconds = 0;  ///< forward time without checkpointing
  /// Forward time with every op intercepted: forward_seconds plus what the intercepted run spent
  /// outside its ops (the region's set-up and end; the same Note).
  double selective_forward_seconds = 0;
  /// Recomputation in backward with every op kept: selective's fixed cost. The selective replay's
  /// (host) time where `replayed`, else the time of the forward run again.
  double replay_seconds = 0;
  /// Its recomputations in the profiled step were all selective replays (training replays it too);
  /// false: at least one ran its forward again (replay off, or a region it cannot replay).
  bool replayed = false;
  /// Backward time without checkpointing: from when the gradient of its output is ready to when
  /// those of its inputs are (inputs that are not autograd leaves; a module without such inputs
  /// ends where the next module's backward starts, or the step ends). Summed over its calls.
  /// 0: not measured (a profile saved before it was); the time line then assumes twice its forward.
  double backward_seconds = 0;
  std::vector<OpProfile> ops;  ///< in forward order
  /// Under a selective policy, whatever it keeps: the bits the region keeps of its in-place random
  /// draws (dropout on CPU draws with bernoulli_; the replay writes the draw back rather than
  /// drawing again), held until the region is rebuilt. Summed over its calls; 0 on CUDA, where
  /// dropout returns its mask.
  int64_t draw_bytes = 0;
  /// The ops' `reads` and `saved_for_backward` were recorded (false in a profile saved before they
  /// were: the planner then charges every op not kept as recomputed).
  bool dependencies_recorded = false;
};

/// The profile of one training step (see the header comment), made by profile_memory.
///
/// Example:
/// ```
/// recompose::MemoryProfile profile = recompose::profile_memory(*model, step);
/// profile.save("profile.json");
/// auto plan = recompose::solve_plan(recompose::MemoryProfile::load("profile.json"),
///                                   recompose::Budget::parse("40%"));
/// ```
struct MemoryProfile {
  std::string device;  ///< device of the model's parameters, "cpu" or "cuda:0"
  /// Peak bytes held for backward without checkpointing (SavedTensorMeter)
  int64_t bytes_held = 0;
  int64_t other_bytes = 0;  ///< of those, what no profiled module holds (embeddings, head, loss)
  double step_seconds = 0;  ///< one step without checkpointing and without a meter (the third run)
  /// Device <-> host copy bandwidth in bytes/s (the slower direction), measured with 16 MiB of
  /// pinned memory, best of three copies each way on a CUDA device; 0 on CPU, where offloading
  /// frees nothing, and with ProfileOptions::measure_bandwidth(false).
  double copy_bandwidth = 0;
  double profile_seconds = 0;  ///< what profile_memory took, every run included
  /// Device memory the step uses beside what it holds for backward: weights, gradients, optimizer
  /// state, temporaries (on CUDA the caching allocator's peak in the plain run less bytes_held; on
  /// CPU, which has no allocator peak, the model's parameters, gradients and buffers only, a lower
  /// bound). Set it to plan a peak budget for a device the profile was not taken on.
  int64_t resident_bytes = 0;
  std::vector<ModuleProfile> modules;

  /// Every module's backward was measured (backward_seconds > 0): the copy-window time line uses
  /// them; otherwise it assumes each module's backward takes twice its forward.
  bool backward_measured() const;

  /// A table per module and, below it, the ops of each module.
  std::string to_string() const;
  /// JSON with every field above ("format": "recompose.profile", "version": 2); from_json reads
  /// it back, and version 1 files (whose later members read as absent). from_json throws
  /// std::invalid_argument on text that is not such a profile, of another version, or lacking a
  /// member its version has (the message says what is wrong and where).
  std::string to_json() const;
  static MemoryProfile from_json(std::string_view json);
  /// Writes/reads to_json() to/from a file. Throws CheckpointError (a std::runtime_error) if the
  /// file cannot be written or read, std::invalid_argument as from_json.
  void save(const std::filesystem::path& path) const;
  static MemoryProfile load(const std::filesystem::path& path);
};

/// Options of `profile_memory` (and PlannerOptions::profile, for plan_memory).
///
/// Example:
/// ```
/// auto profile = recompose::profile_memory(
///     *model, step, recompose::ProfileOptions().modules({"blocks.0", "blocks.1"}).timed_steps(3));
/// ```
struct ProfileOptions {
  /// Paths of the modules to profile (and later plan for), as in named_modules() of the root:
  /// {"blocks.0", "blocks.1"}. Each must be annotated, listed once, and not nested in another.
  /// Default: {} (every annotated module of the tree that has no annotated ancestor below the
  /// root; the root itself if none of its descendants is annotated)
  TORCH_ARG(std::vector<std::string>, modules) = {};
  /// Measure the device <-> host bandwidth (MemoryProfile::copy_bandwidth) when the model lives
  /// on a CUDA device; false leaves it 0 (the planner then offloads only with a bandwidth or link
  /// of its own, SolveOptions). Default: true
  TORCH_ARG(bool, measure_bandwidth) = true;
  /// Timed runs (the third run, repeated): the step's and each module's forward and backward times
  /// are the least over them, as noise only ever adds time. Each costs a step; more of them make
  /// two profiles of one model on a busy machine agree better. Must be at least 1. Default: 1
  TORCH_ARG(int64_t, timed_steps) = 1;
};

/// Profiles one training step of `model`: `step` must run a forward and a backward through it
/// (it runs 2 + ProfileOptions::timed_steps times; a stateful optimizer stepped in it keeps its
/// own state of the runs). `options`: which modules, whether to measure the bandwidth, how many
/// timed runs.
///
/// Errors: std::invalid_argument if `step` is empty, timed_steps is below 1, a path of
/// ProfileOptions::modules names no module (or one that is not annotated, one listed twice, or one
/// nested in another), or no module of the tree is annotated; CheckpointError if a profiled module
/// is already checkpointed (or offloaded), if the step saved nothing for backward (grad mode
/// off?), or if it never called a profiled module. Exceptions thrown by `step` go through; the
/// model is left as it was, in every case.
///
/// Example:
/// ```
/// auto step = [&] { model->forward(x).sum().backward(); };
/// recompose::MemoryProfile profile = recompose::profile_memory(*model, step);
/// std::cout << profile.to_string();
/// ```
MemoryProfile profile_memory(torch::nn::Module& model, const std::function<void()>& step,
                             const ProfileOptions& options = {});

}  // namespace recompose
