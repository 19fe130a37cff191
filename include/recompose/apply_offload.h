// Composable activation offload: attach it to a module whose forward carries RECOMPOSE_FORWARD,
// and every tensor that module's forward saves for backward goes to host memory between forward
// and backward (hyper_parallel's swap_wrapper and torchtune's OffloadActivations, without a
// wrapper module: the module tree, parameter names and state_dict do not change).
//
//   auto manager = recompose::SwapManager::create();
//   for (auto& block : model->blocks)
//     recompose::apply_offload(block, recompose::OffloadOptions().manager(manager));
//   auto loss = model(x).sum();   // block i's saved tensors leave the device as block i+1 starts
//   loss.backward();              // block i-1 is reloaded while backward works on block i
//   recompose::offload_stats(*model->blocks[0]).bytes_offloaded;
//
// How it runs:
// - Each call of an offloaded module is one swap group of the manager (SwapGroupScope), so the
//   forward order of the modules gives the prefetch order in backward: no manual pairing of
//   layers (hyper_parallel's set_forward_prefetch_layer) is needed.
// - A call's copies start when the NEXT call of an offloaded module (any module offloaded on this
//   thread) begins, so the last call's tensors, which backward needs first, never leave the
//   device (as torchtune does). OffloadOptions::keep_last_on_device(false) starts them at the end
//   of each call instead.
// - Which tensors go: those SwapManager::eligible accepts (size threshold, not parameters, whole
//   storages; see recompose/swap.h) and that the per-tensor `policy` does not keep.
// - Composition: applied to the same module as apply_checkpoint, in either order, the
//   checkpointed region runs inside the offload: the region keeps only its inputs, and those are
//   offloaded. Inside a checkpointed region (an offloaded child of a checkpointed module) and
//   during recomputation it does nothing: the region already keeps nothing there. With grad mode
//   off it does nothing.
//
// Never-stall mode (OffloadOptions::never_stall, with the link's bandwidths and cost per copy):
// a call's tensors go to host memory only where their copies fit in the compute that hides them:
// out during the next offloaded call's forward (its window: forward_window_seconds, or the
// call's own measured forward time, the next block of a stack of equal blocks taking as long),
// back during the backward of the call after it (backward_window_seconds, or twice the forward
// window). It decides once: the first warmup_calls (4) calls of a module that save the same
// tensors (a shape: their bytes in saved order) measure their windows, and from the last of them
// on, what goes is fixed from the link and the shortest windows measured: tensors taken in saved
// order while the running total fits both windows, the others staying on the device
// (OffloadStats::tensors_over_window). So every later call of that shape moves the same bytes,
// step after step, and only bytes that every measured window hides; the warm-up's earlier calls
// choose by their own windows. New input sizes are a new shape, with a warm-up of its own.
// See Note [ Never-stall offload decides once ] (lib/swap/never_stall_plan.h). What it moves is
// reported per module (offload_stats) and per step (offload_report).
//
//   recompose::apply_offload(block, recompose::OffloadOptions().manager(manager)
//                                        .never_stall(recompose::measure_link(device)));
//
// CPU tensors take the same path with host-to-host copies: it saves no memory on CPU, and is
// there so that logic and gradients are tested without a GPU.
#pragma once

#include <recompose/copy_link.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/swap.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace recompose {

/// The API name under which the offload state is attached (see hooks::applied_apis).
inline constexpr const char* kOffloadApi = "recompose.offload";

/// What happens to one eligible saved tensor (hyper_parallel's ActivationPolicy).
enum class ActivationPolicy {
  SAVE,  ///< stays on the device
  SWAP,  ///< goes to host memory until backward needs it
};

/// Options of `apply_offload` and `apply_offload_to`.
///
/// Example:
/// ```
/// auto manager = recompose::SwapManager::create();
/// recompose::apply_offload(block, recompose::OffloadOptions()
///                                     .manager(manager)
///                                     .policy([](const at::Tensor& t) {
///                                       return t.dim() == 2 ? recompose::ActivationPolicy::SAVE
///                                                           : recompose::ActivationPolicy::SWAP;
///                                     }));
/// recompose::apply_offload(other_block, recompose::OffloadOptions().manager(manager)
///                                           .never_stall(recompose::measure_link(device)));
/// ```
struct OffloadOptions {
  /// The manager that copies and prefetches (its SwapOptions: size threshold, prefetch depth,
  /// pinned pool, filter). Modules that should prefetch each other must share one manager.
  /// Default: nullptr (SwapManager::default_manager())
  TORCH_ARG(std::shared_ptr<SwapManager>, manager) = nullptr;
  /// Per-tensor decision for tensors the manager finds eligible. Default: nullptr (every one is
  /// swapped)
  TORCH_ARG(std::function<ActivationPolicy(const at::Tensor&)>, policy) = nullptr;
  /// Leave the most recent call's tensors on the device until the next offloaded call begins
  /// (the last module of a forward keeps its activations: backward needs them first); false
  /// starts a call's copies as the call ends. Default: true
  TORCH_ARG(bool, keep_last_on_device) = true;
  /// Never-stall mode: offload only what the link moves inside the windows (see the header
  /// comment). The link must be LinkModel::valid(), or apply_offload throws
  /// std::invalid_argument. Default: std::nullopt (off: every eligible tensor the policy swaps
  /// goes)
  TORCH_ARG(std::optional<LinkModel>, never_stall) = std::nullopt;
  /// Never-stall mode: the forward compute in which a call's copies to host must land; 0: the
  /// call's own forward time, measured on the host clock (on a GPU that is the launch time unless
  /// the step is device-bound: give the profiled time there, e.g. the planner's). Must not be
  /// negative. Default: 0
  TORCH_ARG(double, forward_window_seconds) = 0;
  /// Never-stall mode: the backward compute in which a call's copies back must land; 0: twice
  /// the forward window. Must not be negative. Default: 0
  TORCH_ARG(double, backward_window_seconds) = 0;
  /// Never-stall mode: the calls of a module, per shape of what they save, whose windows are
  /// measured before what it moves is fixed (at least 1; 1 decides from the first call alone).
  /// Why 4: Note [ Never-stall offload decides once ]. Default: 4
  TORCH_ARG(int64_t, warmup_calls) = 4;
};

/// What the calls of one offloaded module did since apply_offload or reset_offload_stats
/// (offload_stats), or of a tree's offloaded modules together (total_offload_stats).
///
/// Example:
/// ```
/// recompose::OffloadStats st = recompose::offload_stats(*model->blocks[0]);
/// std::cout << st.bytes_offloaded << " bytes offloaded at "
///           << st.achieved_bytes_per_second() / 1e9 << " GB/s\n";
/// ```
struct OffloadStats {
  int64_t calls = 0;  ///< forward calls that offloaded (grad mode on, outside checkpointed regions)
  int64_t tensors_offloaded = 0;  ///< copies to host memory launched
  int64_t bytes_offloaded = 0;    ///< their bytes
  int64_t tensors_kept = 0;       ///< not eligible, or kept by the policy: stayed on the device
  int64_t bytes_kept = 0;         ///< their bytes
  /// Eligible, but backward asked for them before the next offloaded call began, so they never
  /// left the device (keep_last_on_device: the last module's tensors).
  int64_t tensors_left_on_device = 0;
  int64_t bytes_left_on_device = 0;  ///< their bytes
  /// Never-stall mode: eligible and swapped by the policy, but their copies would not have landed
  /// inside the window: they stayed on the device.
  int64_t tensors_over_window = 0;
  int64_t bytes_over_window = 0;  ///< their bytes
  double window_seconds = 0;      ///< never-stall: the forward windows its calls offered, summed
  /// Never-stall: calls that chose their copies by their own windows while their shape warmed up,
  /// and decisions made (one per shape of saved tensors; the calls after a decision move what it
  /// fixed). See Note [ Never-stall offload decides once ].
  int64_t warmup_calls = 0;
  int64_t decisions = 0;  ///< see warmup_calls
  /// Copies to host seen landed: their bytes and the time from their launch until recompose saw
  /// them landed (exact on CPU, where copies are synchronous; on a device an upper bound, checked
  /// when the next offloaded call starts, so the bandwidth below is a lower bound there).
  int64_t bytes_landed = 0;
  double landing_seconds = 0;  ///< see bytes_landed
  /// bytes_landed / landing_seconds; 0 when nothing landed.
  double achieved_bytes_per_second() const {
    return landing_seconds > 0 ? static_cast<double>(bytes_landed) / landing_seconds : 0.0;
  }
};

/// Attaches activation offload to `module` (whose forward carries RECOMPOSE_FORWARD) and returns
/// it; from its next forward with grad mode on, what the forward saves for backward goes to host
/// memory as the header comment says. Overloads take a std::shared_ptr<M> or a ModuleHolder
/// (Block) and return it.
///
/// Throws hooks::CompositionError if the module is already offloaded; std::invalid_argument if its
/// forward is not annotated with RECOMPOSE_FORWARD, it is not owned by a std::shared_ptr, or an
/// option is out of range (never_stall's link not LinkModel::valid(), a negative window,
/// warmup_calls below 1).
///
/// Example:
/// ```
/// auto manager = recompose::SwapManager::create();
/// for (auto& block : model->blocks)
///   recompose::apply_offload(block, recompose::OffloadOptions().manager(manager));
/// ```
torch::nn::Module& apply_offload(torch::nn::Module& module, const OffloadOptions& options = {});

template <class M>
std::shared_ptr<M> apply_offload(const std::shared_ptr<M>& module,
                                 const OffloadOptions& options = {}) {
  apply_offload(static_cast<torch::nn::Module&>(*module), options);
  return module;
}

template <class M>
torch::nn::ModuleHolder<M>& apply_offload(torch::nn::ModuleHolder<M>& module,
                                          const OffloadOptions& options = {}) {
  apply_offload(static_cast<torch::nn::Module&>(*module), options);
  return module;
}

namespace detail {
int64_t apply_offload_where(torch::nn::Module& model,
                            const std::function<bool(const torch::nn::Module&)>& match,
                            const std::string& type_name, const OffloadOptions& options);
}  // namespace detail

/// Offloads every module of type M (BlockImpl, or its holder Block) in `model`'s tree, `model`
/// included, wherever it sits (private members too), as apply_checkpoint_to does for
/// checkpointing; modules that should prefetch each other share options.manager(). Returns how
/// many. All or nothing: if one module cannot be offloaded, those done are undone and the error
/// goes on. Throws std::invalid_argument if no module of type M is found, and what apply_offload
/// throws.
///
/// Example:
/// ```
/// recompose::apply_offload_to<BlockImpl>(*model, recompose::OffloadOptions().manager(manager));
/// ```
template <class M>
int64_t apply_offload_to(torch::nn::Module& model, const OffloadOptions& options = {}) {
  return detail::apply_offload_where(model, &hooks::is_module_of_type<M>, hooks::type_name_of<M>(),
                                     options);
}
template <class M, class Root>
int64_t apply_offload_to(torch::nn::ModuleHolder<Root>& model, const OffloadOptions& options = {}) {
  return apply_offload_to<M>(static_cast<torch::nn::Module&>(*model), options);
}

/// Detaches offload from `module`; tensors already offloaded still come back in backward.
/// Returns false if the module was not offloaded.
///
/// Example:
/// ```
/// for (auto& block : model->blocks) recompose::remove_offload(block);
/// ```
bool remove_offload(torch::nn::Module& module);
template <class M>
bool remove_offload(torch::nn::ModuleHolder<M>& module) {
  return remove_offload(static_cast<torch::nn::Module&>(*module));
}

/// True if apply_offload is attached to `module`.
///
/// Example:
/// ```
/// if (!recompose::is_offloaded(*block)) recompose::apply_offload(block);
/// ```
bool is_offloaded(const torch::nn::Module& module);

/// The counters of an offloaded module since apply_offload or its last reset_offload_stats.
/// Throws CheckpointError if the module is not offloaded.
///
/// Example:
/// ```
/// int64_t moved = recompose::offload_stats(*model->blocks[0]).bytes_offloaded;
/// ```
OffloadStats offload_stats(const torch::nn::Module& module);
/// Sets the counters of an offloaded module to zero. Throws CheckpointError if the module is not
/// offloaded.
///
/// Example:
/// ```
/// recompose::reset_offload_stats(*model->blocks[0]);   // before a step, for per-step counts
/// ```
void reset_offload_stats(torch::nn::Module& module);

/// A table of what the offloaded modules of `root`'s tree (root included) did since their stats
/// were reset: per module, what went to host memory, what stayed and why (not eligible or kept by
/// the policy, the last call, over the window), the achieved bandwidth; then the totals (reset
/// the stats after each step for a per-step report). Modules that are not offloaded are skipped.
///
/// Example:
/// ```
/// model(x).sum().backward();
/// std::cout << recompose::offload_report(*model);
/// ```
std::string offload_report(const torch::nn::Module& root);
/// The totals of that table: the counters of every offloaded module of `root`'s tree (root
/// included) added up; all zero when none is offloaded.
///
/// Example:
/// ```
/// int64_t moved = recompose::total_offload_stats(*model).bytes_offloaded;
/// ```
OffloadStats total_offload_stats(const torch::nn::Module& root);

}  // namespace recompose
