// A checkpoint/offload plan: per module, what to do with what its forward saves for backward.
// Made by solve_plan / plan_memory (recompose/planner.h), applied with apply_plan. A plan is a
// value: print it as a table, save it as JSON and load it in a training job that applies it
// without profiling again.
//
//   recompose::Plan plan = recompose::plan_memory(*model, step, recompose::Budget::parse("40%"));
//   std::cout << plan.to_table();
//   plan.save("plan.json");
//   ...
//   recompose::apply_plan(*model, recompose::Plan::load("plan.json"));
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace recompose {

/// What a plan does with one module (ModulePlan::choice).
enum class ModuleChoice {
  None,       ///< no checkpointing: autograd keeps what the forward saves
  Full,       ///< apply_checkpoint: only the inputs are kept, the forward is recomputed in backward
  Selective,  ///< apply_checkpoint with a selective policy: the ops listed in `save` are kept,
              ///< those in `swap` are kept in host memory, the others are recomputed
  Offload,    ///< apply_offload: what the forward saves goes to host memory until backward
  FullSwapInputs,  ///< apply_checkpoint with swap_inputs: as Full, and the inputs it keeps wait in
                   ///< host memory (on a device: the least a module can hold, for the cost of a
                   ///< recomputation and two copies of its inputs)
};

/// The name of a choice, as to_table() and the JSON write it: "none", "full", "selective",
/// "offload", "full-swap-inputs". Does not throw.
///
/// Example:
/// ```
/// for (const auto& m : plan.modules)
///   std::cout << m.name << ": " << recompose::module_choice_name(m.choice) << "\n";
/// ```
std::string_view module_choice_name(ModuleChoice choice);

/// An op of a module's forward: its overload ("aten::mm.default") and its call index among the
/// calls of that overload in one forward of the module (SelectiveCheckpointContext::call_index).
///
/// Example:
/// ```
/// recompose::PlannedOp second_mm{"aten::mm.default", 1};
/// ```
struct PlannedOp {
  std::string op;          ///< the overload, as "aten::mm.default"
  int64_t call_index = 0;  ///< how many calls of `op` came before it in the module's forward
  bool operator==(const PlannedOp&) const = default;
};

/// What a plan does with one module.
///
/// Example: keep the first matrix product of "blocks.0", recompute the rest
/// ```
/// recompose::ModulePlan m{.name = "blocks.0", .type = "BlockImpl",
///                         .choice = recompose::ModuleChoice::Selective,
///                         .save = {{"aten::mm.default", 0}}};
/// ```
struct ModulePlan {
  std::string name;  ///< path from the root the plan is applied to ("blocks.0")
  std::string type;  ///< torch::nn::Module::name(): apply_plan checks it
  ModuleChoice choice = ModuleChoice::None;  ///< what is done with the module
  std::vector<PlannedOp> save;               ///< Selective: kept on the device
  std::vector<PlannedOp> swap;               ///< Selective: kept in host memory (MUST_SWAP)
  int64_t bytes = 0;                         ///< estimated bytes held for backward
  double seconds = 0;                        ///< estimated extra step time against no checkpointing
  bool operator==(const ModulePlan&) const = default;
};

/// One candidate plan_memory / choose_plan weighed (recompose/planner.h): its estimates, what its
/// trial steps measured, and why it was or was not chosen (Plan::trials).
///
/// Example:
/// ```
/// for (const auto& t : plan.trials) std::cout << t.name << ": " << t.verdict << "\n";
/// ```
struct PlanTrial {
  std::string name;   ///< the candidate's name (PlanCandidate::name): "full", "solver (swaps)"
  int64_t bytes = 0;  ///< estimated bytes held for backward
  double step_seconds = 0;  ///< estimated step time
  int64_t peak_bytes = 0;   ///< simulated peak device memory of the step
  // Measured in its trial steps; -1 / 0: not measured (not tried, or not measurable here).
  int64_t measured_bytes = -1;  ///< held for backward (SavedTensorMeter's peak), first step; -1
  int64_t measured_peak_bytes = -1;  ///< the device's peak reserved memory (CUDA); -1 on CPU
  double measured_seconds = 0;       ///< median of its timed steps; 0: not measured
  int64_t timed_steps = 0;           ///< how many timed steps it ran
  bool chosen = false;               ///< the plan returned is this candidate's
  /// "chosen", or why not: slower than the chosen one (by how much), over the budget as measured,
  /// or not tried (its estimate, or the planning step budget).
  std::string verdict;
  /// One line of C++ that applies this candidate to a model.
  std::string reproduce;
  bool operator==(const PlanTrial&) const = default;
};

/// A checkpoint/offload plan for a model: per module, its choice (see the header comment).
///
/// Example:
/// ```
/// recompose::Plan plan = recompose::solve_plan(profile, recompose::Budget::parse("40%"));
/// std::cout << plan.to_table();
/// plan.save("plan.json");
/// recompose::apply_plan(*model, recompose::Plan::load("plan.json"));
/// ```
struct Plan {
  int64_t budget_bytes = 0;  ///< what it was solved for
  /// Estimated bytes held for backward, whole step (<= budget_bytes)
  int64_t bytes = 0;
  double step_seconds = 0;       ///< estimated step time
  int64_t none_bytes = 0;        ///< the profile's bytes held without checkpointing
  double none_step_seconds = 0;  ///< the profile's step time without checkpointing
  double solve_seconds = 0;      ///< what solving took
  /// Simulated peak device memory of the step under the plan: the profile's resident_bytes plus
  /// the activations at their busiest moment, forward or backward (copy-window model).
  int64_t peak_bytes = 0;
  /// The time line behind the estimates had each module's backward as profiled
  /// (MemoryProfile::backward_measured()); false: assumed twice its forward.
  bool backward_measured = false;
  /// One entry per module the plan names.
  std::vector<ModulePlan> modules;
  /// Made by plan_memory / choose_plan: every candidate weighed (the chosen one included), in the
  /// order of their estimates; empty for solve_plan's plans.
  std::vector<PlanTrial> trials;
  /// What profiling (plan_memory), solving and the trials took, in seconds and in plain steps (the
  /// profile's measured step without checkpointing); 0 for solve_plan's plans.
  double planning_seconds = 0;
  double planning_steps = 0;  ///< see planning_seconds

  /// One row per module: choice, kept/swapped/recomputed op counts, estimated bytes and time;
  /// then the totals against no checkpointing, and the trials' table where there is one.
  std::string to_table() const;
  /// JSON with every field above ("format": "recompose.plan", "version": 2); from_json reads it
  /// back (plan == from_json(plan.to_json())), and version 1 files (no trials). from_json throws
  /// std::invalid_argument on text that is not such a plan, of another version, or lacking a
  /// member its version has.
  std::string to_json() const;
  static Plan from_json(std::string_view json);
  /// Writes/reads to_json() to/from a file. Throws CheckpointError (a std::runtime_error) if the
  /// file cannot be written or read, std::invalid_argument as from_json.
  void save(const std::filesystem::path& path) const;
  static Plan load(const std::filesystem::path& path);
  bool operator==(const Plan&) const = default;
};

}  // namespace recompose
