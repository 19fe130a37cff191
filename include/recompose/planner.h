// Memory-budget planner: give it a byte budget for what a training step holds for backward, get
// the plan (per module none / full / selective / offload, per op save / recompute / swap) with the
// smallest estimated step time that fits.
//
//   auto step = [&] { loss_of(model, batch).backward(); };          // forward + backward
//   recompose::Plan plan = recompose::plan_memory(*model, step, recompose::Budget::parse("40%"));
//   recompose::apply_plan(*model, plan);                            // train under it
//   std::cout << plan.to_table();
//   recompose::remove_plan(*model, plan);
//
// The solver (solve_plan) works on a MemoryProfile (recompose/memory_profile.h). Each module's
// candidate configurations are points (bytes held, extra time): no checkpointing; full
// checkpointing; selective checkpointing keeping the k ops with the most time saved per byte,
// for every k, and keeping what transformer_policy keeps (with and without every second mm);
// offload, where it pays. Combining the modules one by one, it keeps the Pareto frontier of whole
// plans (fewer bytes or less time; one plan per 1/4096 of the byte range), for plans without
// copies, with swaps and with module offload apart. The frontiers do not depend on the budget: the
// plan for a budget is the fastest estimate among each frontier's plans that fit and
// transformer_policy on every module, so a larger budget never gives a plan taking more estimated
// time, and no plan's estimate exceeds its budget.
//
// Offload costs come from the copy-window model: a module's copies out run in the next
// module's forward and its copies back in the backward of the module after it, and only what
// does not fit there counts (selective: the ops swapped are those whose copies fit, the rest is
// recomputed or kept). With a peak budget (Budget::peak_bytes), the plan is the frontier's
// fastest whose simulated step peak (Plan::peak_bytes) fits.
// Estimates: bytes = what no module holds + per module its inputs and kept outputs (or what it
// saves without checkpointing; nothing when offloaded, but a plan with offloaded modules also
// counts the largest module's saved bytes once: an offloaded module holds them until its call
// ends and its copies start); time = the profiled step + per module its recomputation (its
// forward for full; interception, replay and the recomputed ops for selective) or its copies
// at the measured bandwidth (offload, swap). Estimates come from one profiled step, where each
// module is measured once; twin modules (same type, input bytes and ops with the same output
// bytes: identical blocks) are repeats of one measurement, and each twin is estimated at the
// least time its group measured (per forward, replay and op), so twins get the same estimates and
// a cold first block or a stalled call does not move the plan. Other modules keep their own
// measurement: on a noisy machine, profile after a warm-up step.
#pragma once

#include <recompose/copy_link.h>
#include <recompose/memory_plan.h>
#include <recompose/memory_profile.h>

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace recompose {

class SwapManager;  // recompose/swap.h

/// Bytes held for backward, absolute or as a fraction of the profile's no-checkpointing figure,
/// or a peak of device memory for the whole step. Made by its static functions.
///
/// Example:
/// ```
/// auto a = recompose::Budget::parse("40%");              // == Budget::fraction(0.4)
/// auto b = recompose::Budget::bytes(int64_t{3} << 30);   // == Budget::parse("3GiB")
/// auto c = recompose::Budget::parse("peak=20GiB");       // == Budget::peak_bytes(20LL << 30)
/// int64_t held = a.resolve(profile);                     // 40% of profile.bytes_held
/// ```
class Budget {
 public:
  /// At most `bytes` held for backward. Throws std::invalid_argument if `bytes` is not positive.
  static Budget bytes(int64_t bytes);
  /// At most `fraction` of the profile's bytes held without checkpointing
  /// (MemoryProfile::bytes_held). Throws std::invalid_argument unless 0 < `fraction` (finite;
  /// above 1 means no checkpointing).
  static Budget fraction(double fraction);
  /// "40%" (a fraction), "123456" (bytes), "12.5MiB", "3GiB", "512KiB", "64MB" (units of 1024 and
  /// 1000), "50B". Throws std::invalid_argument naming the text if it is none of these or not
  /// positive, and for a bare number up to 100 ("50": a percentage without its '%'? write "50%",
  /// or "50B" for bytes).
  /// "peak=20GiB" (any of the byte forms above after "peak="): Budget::peak_bytes; a percentage
  /// after "peak=" throws std::invalid_argument.
  static Budget parse(std::string_view text);
  /// Peak device memory of the whole step: weights, gradients, optimizer state and temporaries
  /// (MemoryProfile::resident_bytes) plus the activations at the step's busiest moment, forward
  /// or backward, as the copy-window model simulates the plan (recomputations and copies in
  /// flight included). "Make this fit in 20 GiB":
  /// solve_plan(profile, Budget::peak_bytes(int64_t{20} << 30)).
  /// Throws std::invalid_argument if `bytes` is not positive.
  static Budget peak_bytes(int64_t bytes);

  /// The budget in bytes held for backward for `profile` (a fraction: of its bytes_held, rounded;
  /// a peak budget: the peak less the profile's resident_bytes).
  int64_t resolve(const MemoryProfile& profile) const;
  /// Made by fraction(), or parse() of a percentage.
  bool is_fraction() const { return fraction_ > 0; }
  /// Made by peak_bytes(), or parse() of "peak=...".
  bool is_peak() const { return peak_; }

 private:
  Budget(int64_t bytes, double fraction, bool peak = false)
      : bytes_(bytes), fraction_(fraction), peak_(peak) {}
  int64_t bytes_ = 0;
  double fraction_ = 0;
  bool peak_ = false;
};

/// When the solver may offload (module offload, and MUST_SWAP of single ops).
enum class OffloadMode {
  /// On a device (not CPU) profile, when a bandwidth is known: SolveOptions::link,
  /// SolveOptions::copy_bandwidth or the profile's copy_bandwidth
  Auto,
  Never,   ///< no copies: plans checkpoint or keep
  Always,  ///< even on CPU (where it frees nothing for real): to test the offload path
};

/// Options of `solve_plan`, `candidate_plans`, `estimate_plan`, `min_plan_bytes` and
/// `min_plan_peak_bytes` (and PlannerOptions::solve).
///
/// Example:
/// ```
/// auto plan = recompose::solve_plan(
///     profile, recompose::Budget::parse("peak=20GiB"),
///     recompose::SolveOptions().link(recompose::measure_link(device)).allocator_headroom(0.08));
/// ```
struct SolveOptions {
  /// When the solver may offload (see OffloadMode). Default: OffloadMode::Auto
  TORCH_ARG(OffloadMode, offload) = OffloadMode::Auto;
  /// Bytes/s to assume for offload copies, both ways; 0: the profile's copy_bandwidth. With
  /// OffloadMode::Always and no bandwidth anywhere, 1e10 (10 GB/s). Where `link` is set, the link
  /// is used instead (a copy_bandwidth given only keeps the profile's from capping it).
  /// Default: 0
  TORCH_ARG(double, copy_bandwidth) = 0;
  /// The link of the copy-window model (bandwidth each way, fixed cost per copy; measure_link on
  /// a GPU). Unless copy_bandwidth is given, each of its bandwidths is capped at the profile's
  /// copy_bandwidth where the profile has one. An offload costs only what its copies do not hide
  /// in the compute around them (lib/planner/copy_window_model.h). Default: std::nullopt
  /// (copy_bandwidth, or the profile's, both ways, no fixed cost)
  TORCH_ARG(std::optional<LinkModel>, link) = std::nullopt;
  /// The swap manager's throttle the plan runs under (SwapOptions::max_groups_in_flight; 0: none):
  /// an offloading module waits until at most this many less one earlier modules' copies are in
  /// flight, and the simulated step (Plan::step_seconds) counts that wait. Must not be negative.
  /// Default: 2 (SwapOptions' default)
  TORCH_ARG(int64_t, max_groups_in_flight) = 2;
  /// With a peak budget on a device (not CPU, where it is not applied): the share of the budget
  /// left to the caching allocator beside the simulated peak, so that fragmentation does not make
  /// it free its cache and retry cudaMalloc. A plan fits when its simulated peak
  /// (Plan::peak_bytes), plus the largest module's offloaded bytes where it swaps (reloads are
  /// allocated on the copy stream, whose cached blocks the compute stream does not reuse), is at
  /// most (1 - allocator_headroom) of the budget. On the H200 (run 18, a 10.43 GiB cap), plans at
  /// 0.907x the cap ran with no retry and one at 0.943x with its swaps retried 1.3 times a step.
  /// 0 for a budget that is not a hard limit. solve_plan throws std::invalid_argument unless
  /// 0 <= allocator_headroom < 1. Default: 0.06
  TORCH_ARG(double, allocator_headroom) = 0.06;
};

/// The fastest plan (estimated) for `profile` that holds at most `budget` bytes for backward (a
/// peak budget: whose simulated peak, with SolveOptions::allocator_headroom, fits). Its estimate
/// (Plan::step_seconds) is the larger of the modules' costs added up and the simulated step (copy
/// waits included); the plan is the fastest by that estimate among the frontier's fastest fitting
/// plan of each kind (with module offload, with swaps, with no copy at all) and every module under
/// transformer_policy, so it is never estimated slower than a plan it knows fits. Runs nothing:
/// the profile alone.
///
/// Throws std::invalid_argument if the budget is below the least any plan holds (the message gives
/// that minimum: full checkpointing, or offload, everywhere), a peak budget no plan's simulated
/// peak fits, the profile has no module or an option is out of range.
///
/// Example:
/// ```
/// auto profile = recompose::MemoryProfile::load("profile.json");
/// recompose::Plan plan = recompose::solve_plan(profile, recompose::Budget::parse("40%"));
/// std::cout << plan.to_table();
/// ```
Plan solve_plan(const MemoryProfile& profile, const Budget& budget,
                const SolveOptions& options = {});

/// One plan the planner may choose for a budget, with its estimates (Plan::bytes, step_seconds,
/// peak_bytes). Returned by candidate_plans.
struct PlanCandidate {
  /// "solver (no copies)", "solver (swaps)", "solver (offload)": a family of the solver's
  /// frontier; "none", "full", "transformer_policy", "every second mm", "offload": a fixed preset.
  std::string name;
  Plan plan;  ///< the plan, with its estimates
};

/// The candidates solve_plan chooses among for `budget` on `profile` with `options` (the same
/// arguments as solve_plan), each estimated as solve_plan estimates a plan (the modules' costs by
/// the solver's pricing, then the simulated peak and step):
/// - per family of the frontier (no copies; swaps of single ops; module offload, the last two only
///   where the solver may offload: SolveOptions::offload, a link), its fastest plan that fits, as
///   solve_plan picks it;
/// - every fixed preset that fits by its estimate: no checkpointing ("none"), full checkpointing
///   of every module ("full"), transformer_policy on every module ("transformer_policy"), the same
///   with every second aten::mm recomputed ("every second mm":
///   TransformerPolicyOptions().recompute_every_second_mm(true)), and offload of every module
///   ("offload", only where the solver may offload).
/// A plan fits when its estimated bytes are at most the budget (Budget::resolve) and, for a peak
/// budget, its simulated peak with SolveOptions::allocator_headroom fits as solve_plan judges it.
/// A plan equal to an earlier candidate's (per module the same choice, kept and swapped ops) is
/// listed once, under the first name of the order above, with that candidate's estimate (where
/// both are plans solve_plan weighs, the faster: the same costs added up in another order may
/// differ in the last bits). Ordered by estimated step time (Plan::step_seconds), fastest first;
/// ties keep the order above. solve_plan's plan is the first of the solver's and
/// transformer_policy's candidates. Each plan's solve_seconds is what the whole call took.
///
/// Throws what solve_plan throws (std::invalid_argument: a budget below the least any plan holds,
/// a peak no plan fits, no module in the profile, an option out of range).
///
/// Example:
/// ```
/// for (const auto& c : recompose::candidate_plans(profile, recompose::Budget::parse("40%")))
///   std::printf("%-20s %8.3f s %10lld bytes\n", c.name.c_str(), c.plan.step_seconds,
///               static_cast<long long>(c.plan.bytes));
/// ```
std::vector<PlanCandidate> candidate_plans(const MemoryProfile& profile, const Budget& budget,
                                           const SolveOptions& options = {});

/// `plan` priced on `profile` as the solver prices its own plans: per module (matched by name) its
/// bytes held and added time for the plan's choice, kept and swapped ops; the plan's bytes, step
/// (Plan::step_seconds) and simulated peak. Modules of the profile the plan does not name are
/// priced as no checkpointing; the returned plan lists every module of the profile, in its order,
/// and keeps `plan`'s budget. For a plan made on another profile (the same model profiled again,
/// another machine) or edited by hand: how it compares with what solve_plan chooses here.
///
/// Throws std::invalid_argument if the plan names a module the profile has not (or of another
/// type), an op a module's profile did not run, a copying choice where `options` allow no copies
/// (no link), or an option out of range (as solve_plan).
///
/// Example:
/// ```
/// const recompose::Plan mine = recompose::solve_plan(profile, budget);
/// const double theirs = recompose::estimate_plan(profile, other_plan).step_seconds;
/// ```
Plan estimate_plan(const MemoryProfile& profile, const Plan& plan,
                   const SolveOptions& options = {});

/// The least bytes any plan for `profile` holds (what solve_plan needs at least, for a budget of
/// bytes or a fraction), over every plan the solver builds with `options` (copies only where they
/// allow them). Throws std::invalid_argument if the profile has no module.
///
/// Example:
/// ```
/// auto plan = recompose::solve_plan(
///     profile, recompose::Budget::bytes(recompose::min_plan_bytes(profile)));
/// ```
int64_t min_plan_bytes(const MemoryProfile& profile, const SolveOptions& options = {});

/// The least peak budget solve_plan accepts for `profile`: the least simulated peak of any plan
/// (the profile's resident_bytes plus the activations at the busiest moment of the step,
/// Budget::peak_bytes), with SolveOptions::allocator_headroom on top. A peak budget below it is
/// refused by solve_plan; at or above it solve_plan finds a plan. Throws std::invalid_argument if
/// the profile has no module or an option is out of range (as solve_plan).
///
/// Example:
/// ```
/// const int64_t least = recompose::min_plan_peak_bytes(profile);
/// auto plan = recompose::solve_plan(profile, recompose::Budget::peak_bytes(least));
/// ```
int64_t min_plan_peak_bytes(const MemoryProfile& profile, const SolveOptions& options = {});

/// How plan_memory and choose_plan measure their candidates (Note [ Choosing by measurement ],
/// lib/planner/plan_trials.cpp). choose_plan throws std::invalid_argument for a value out of
/// range.
///
/// Example:
/// ```
/// auto options = recompose::PlannerOptions().trials(
///     recompose::TrialOptions().max_planning_steps(12).max_candidates(2));
/// ```
struct TrialOptions {
  /// Try the candidates on the model; false: the fastest estimate is chosen, untried (solve_plan's
  /// choice among candidate_plans). Default: true
  TORCH_ARG(bool, enabled) = true;
  /// What profiling, solving and the trials may cost together, in steps without checkpointing
  /// (the profile's measured step; the profile's own MemoryProfile::profile_seconds count, also
  /// when choose_plan is given a profile made earlier). A trial step is started only where its
  /// estimate (scaled by what the trials so far measured against their estimates) fits what is
  /// left: each candidate's first step (on a device a measuring step and a timed one; on CPU one,
  /// both) in the estimates' order, then timed rounds, interleaved, while a whole round fits. A
  /// candidate not reached is "not tried"; where none is, the fastest estimate is chosen untried.
  /// Must be positive. Default: 6
  TORCH_ARG(double, max_planning_steps) = 6;
  /// The most candidates tried; the fastest estimates first. Must be at least 1. Default: 4
  TORCH_ARG(int64_t, max_candidates) = 4;
  /// A candidate estimated more than this many times the fastest estimate is not tried (the
  /// estimates were off by up to 18% on a GPU; none of the candidates so far is off by 1.5x).
  /// Must be at least 1. Default: 1.5
  TORCH_ARG(double, max_estimate_ratio) = 1.5;
};

/// Options of `plan_memory` and `choose_plan`: the profiler's (plan_memory only: choose_plan is
/// given its profile), the solver's and the trials'.
///
/// Example:
/// ```
/// auto plan = recompose::plan_memory(
///     *model, step, recompose::Budget::parse("50%"),
///     recompose::PlannerOptions()
///         .profile(recompose::ProfileOptions().timed_steps(3))
///         .solve(recompose::SolveOptions().offload(recompose::OffloadMode::Never)));
/// ```
struct PlannerOptions {
  /// How the step is profiled (plan_memory). Default: ProfileOptions()
  TORCH_ARG(ProfileOptions, profile) = {};
  /// How the candidates are solved and estimated. Default: SolveOptions()
  TORCH_ARG(SolveOptions, solve) = {};
  /// How the candidates are tried. Default: TrialOptions()
  TORCH_ARG(TrialOptions, trials) = {};
};

/// The candidates of `budget` for `profile` (candidate_plans), the fastest estimates tried on
/// `model` for a few real steps each, interleaved (each under apply_plan, then removed; the model
/// put back as it was after every step, as profile_memory does), and the fastest as measured among
/// those whose measured bytes held for backward fit the budget (a peak budget on a device: whose
/// measured peak of reserved device memory fits it). The plan carries every candidate weighed
/// (Plan::trials: estimated and measured time, bytes and peak, why it was not chosen, one line that
/// reproduces it) and what choosing cost (Plan::planning_seconds, planning_steps: the profile's
/// profile_seconds included). Where no checkpointing fits, it is chosen untried on CPU (nothing is
/// faster). `step` as for profile_memory: a forward and a backward of `model`, which it runs under
/// each candidate. The plan is not applied.
///
/// Errors: those of candidate_plans and apply_plan; std::invalid_argument if `step` is empty or a
/// TrialOptions value is out of range; an exception `step` throws goes through (the model is left
/// as it was).
///
/// Example:
/// ```
/// auto profile = recompose::profile_memory(*model, step);
/// auto plan = recompose::choose_plan(*model, step, profile, recompose::Budget::parse("50%"));
/// std::cout << plan.to_table();   // the plan, then the candidates' table
/// ```
Plan choose_plan(torch::nn::Module& model, const std::function<void()>& step,
                 const MemoryProfile& profile, const Budget& budget,
                 const PlannerOptions& options = {});

/// profile_memory(model, step, options.profile()) then choose_plan(model, step, profile, budget,
/// options): the fastest plan that fits, by measurement among the candidates the estimates rank
/// first. Plan::planning_steps counts the profile's runs too. The plan is not applied; the model
/// is left as it was. Throws what profile_memory and choose_plan throw.
///
/// Example:
/// ```
/// auto step = [&] { loss_of(model, batch).backward(); };
/// recompose::Plan plan = recompose::plan_memory(*model, step, recompose::Budget::parse("40%"));
/// recompose::apply_plan(*model, plan);
/// ```
Plan plan_memory(torch::nn::Module& model, const std::function<void()>& step, const Budget& budget,
                 const PlannerOptions& options = {});

/// Options of `apply_plan`.
///
/// Example:
/// ```
/// auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
/// recompose::apply_plan(*model, plan, recompose::ApplyPlanOptions().swap_manager(manager));
/// ```
struct ApplyPlanOptions {
  /// Manager for Offload and FullSwapInputs modules and swapped ops. Default: nullptr (where the
  /// plan copies, one made by apply_plan for this plan, with SwapOptions().min_bytes(0): the
  /// plan's estimates count every saved tensor as offloaded)
  TORCH_ARG(std::shared_ptr<SwapManager>, swap_manager) = nullptr;
};

/// Applies `plan` to the modules of `model` it names: nothing for None, apply_checkpoint for Full,
/// apply_checkpoint with a selective policy for Selective (MUST_SAVE the kept ops, MUST_SWAP the
/// swapped ones, recompute the rest), apply_checkpoint with swap_inputs(true) for FullSwapInputs,
/// apply_offload with keep_last_on_device(false) for Offload. Each module it applies to is marked
/// for remove_plan.
///
/// All or nothing: on an error, what was applied is removed again. Throws CheckpointError if a
/// named module is missing, of another type (the plan was made for another model), or already
/// checkpointed, offloaded or planned; std::invalid_argument if a planned op is not an overload
/// name ("aten::mm.default") or not registered; and what apply_checkpoint and apply_offload throw.
///
/// Example:
/// ```
/// recompose::apply_plan(*model, recompose::Plan::load("plan.json"));
/// train();
/// ```
void apply_plan(torch::nn::Module& model, const Plan& plan, const ApplyPlanOptions& options = {});

/// Removes what apply_plan attached to the modules `plan` names: apply_plan marks each module it
/// applies to with the composable API "recompose.plan" (hooks::applied_apis lists it), and only
/// marked modules lose their checkpoint or offload; what a user attached afterwards stays. Returns
/// how many modules had something removed.
///
/// Example:
/// ```
/// recompose::apply_plan(*model, plan);
/// train();
/// recompose::remove_plan(*model, plan);   // the model trains plainly again
/// ```
int64_t remove_plan(torch::nn::Module& model, const Plan& plan);

}  // namespace recompose
