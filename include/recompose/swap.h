// Activation swap: offload tensors saved for backward to host memory during the forward and
// bring them back, ahead of need, during the backward.
//
//   auto manager = recompose::SwapManager::create(recompose::SwapOptions().prefetch_groups(1));
//   {
//     recompose::AsyncSaveOnCpu offload(manager);       // every saved tensor in scope is swapped
//     for (auto& layer : layers) {
//       recompose::SwapGroupScope group(*manager);       // one swap group per layer
//       x = layer->forward(x);
//     }
//   }
//   x.sum().backward();   // group i-1 is reloaded while backward works on group i
//   std::cout << manager->stats().bytes_offloaded << " bytes went to host memory\n";
//
// Three ways in: AsyncSaveOnCpu (PyTorch's save_on_cpu, with asynchronous copies and prefetch,
// no checkpointing), CheckpointOptions().swap_inputs(true) (a checkpointed region keeps its
// inputs in host memory instead of device memory), and CheckpointPolicy::MUST_SWAP in selective
// checkpointing (an op's output is kept, in host memory).
//
// How it works on an accelerator (CUDA; docs/notes.md, Note [ Swap copies ]): each offload records
// an event on the current (compute) stream, and a side copy stream per device waits for it and
// copies the tensor into a pinned host buffer (drawn from a pool that is reused across steps). The
// manager holds the device tensor until the copy has landed (checked at every offload and at group
// boundaries), which is when device memory is freed. In backward, the first use of a tensor of
// group i reloads the rest of group i and prefetches groups i-1 .. i-prefetch_groups on the copy
// stream; the consumer stream (the current stream of the thread that unpacks, which is an autograd
// device thread for CUDA graphs) waits on the copy's event, on the device, not on the host, and
// the manager holds the reloaded tensor until that stream is done with it. Nothing is
// record_stream'ed, so swap leaves the caching allocator no end-of-life event that a later CUDA
// graph capture could trip on (pytorch#193982).
//
// CUDA graphs: swap does not run inside a capture. An offload, a reload, a prefetch or
// SwapManager::synchronize while the current stream is being captured throws CheckpointError
// (nothing is launched); group scopes and polls inside a capture do nothing, and the next call
// outside it catches up. Capturing after swapped steps, or around code that swaps nothing, works,
// random numbers drawn inside the capture included.
//
// What stays on the device (SwapManager::eligible): tensors smaller than min_bytes, parameters
// (leaves that require grad) and views of them, tensors that do not cover their whole storage
// (slices: offloading them frees nothing while the rest of the storage is alive), non-strided
// tensors (sparse, mkldnn, nested) and tensors the optional filter rejects. AsyncSaveOnCpu copies
// an input that needs no gradient only once the op that saved it is done (when the next op
// begins, or at the scope's end): the op's kernel may write into it after saving it
// (rrelu_with_noise's noise). A tensor that is alive elsewhere anyway (a buffer, an input the
// caller keeps) is offloaded but frees nothing; reject it with the filter.
//
// CPU tensors: the same code runs with synchronous host-to-host copies, so that the logic and
// the gradients are tested on machines without a GPU. This saves NO memory; it only costs time.
//
// When swap beats recompute: swap costs PCIe bandwidth, recompute costs FLOPs. Swap wins when
// the saved activations of a layer can cross the bus (about 25 GB/s per direction on PCIe 4 x16,
// 50 on PCIe 5, much more on NVLink-C2C) in less time than the next layer's forward takes, i.e.
// for compute-dense layers (large matrix products, attention) with moderate activations, and
// when the host has pinned memory to spare. Recompute wins for cheap, activation-heavy ops
// (pointwise, norms, dropout) and when the bus is shared (data loading, several GPUs per switch).
// Selective checkpointing combines them: MUST_SWAP for the outputs of expensive ops, recompute
// for the cheap ones.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace recompose {

namespace detail {
class SwapCore;     // lib/swap/swap_core.h
struct SwapEntry;   // lib/swap/swap_entry.h: the state of one SwappedTensor
struct SwapAccess;  // lib/swap/swap_access.h: the library's way in
}  // namespace detail

/// Options of a SwapManager (SwapManager::create). SwapManager::create throws
/// std::invalid_argument, naming the option, for a negative size or count (max_pool_bytes: below
/// -1).
///
/// Example:
/// ```
/// auto manager = recompose::SwapManager::create(recompose::SwapOptions()
///                                                   .min_bytes(int64_t{4} << 20)
///                                                   .prefetch_groups(2)
///                                                   .filter([](const at::Tensor& t) {
///                                                     return t.dim() > 1;   // keep vectors
///                                                   }));
/// ```
struct SwapOptions {
  /// Saved tensors smaller than this (bytes) stay on the device: the copy would cost more in
  /// latency than it frees (empty tensors always stay). Tests set 0. Default: 1 MiB (1 << 20)
  TORCH_ARG(int64_t, min_bytes) = int64_t{1} << 20;
  /// How many earlier groups are reloaded when backward first uses a tensor of a group (0: none,
  /// each group is loaded on demand when backward reaches it). Default: 1
  TORCH_ARG(int64_t, prefetch_groups) = 1;
  /// Tensors saved outside any explicit group (SwapGroupScope) form implicit groups of about
  /// this many bytes, so that AsyncSaveOnCpu around a whole model still prefetches in steps.
  /// 0: a group per tensor. Default: 64 MiB (64 << 20)
  TORCH_ARG(int64_t, implicit_group_bytes) = int64_t{64} << 20;
  /// How many groups may have copies to host in flight, the one offloading included: when a
  /// tensor of a group is offloaded while this many earlier groups still have copies in flight,
  /// the offload first waits, on the host, for the oldest ones' copies to land, so that their
  /// device memory is freed while forward runs. Without this bound (0), a forward that produces
  /// activations faster than the link copies them ends with most of them still on the device (in
  /// flight), and the peak memory barely drops. Each wait is counted in SwapStats::offload_waits
  /// and its time in wait_seconds. Default: 2 (one earlier group in flight at most)
  TORCH_ARG(int64_t, max_groups_in_flight) = 2;
  /// Use pinned (page-locked) host buffers for accelerator tensors, required for copies that
  /// overlap with compute. Ignored for CPU tensors. Default: true
  TORCH_ARG(bool, pin_memory) = true;
  /// Idle host buffers kept in the pool for the next step (bytes); -1: no limit, 0: no pool.
  /// Default: -1
  TORCH_ARG(int64_t, max_pool_bytes) = -1;
  /// When a reload has not landed by the time backward needs it, wait for it on the host and
  /// add the time to SwapStats::wait_seconds (exact accounting, but the host stops queueing
  /// work meanwhile). When false the consumer stream waits on the device (no host stall) and
  /// such reloads are only counted in SwapStats::late_reloads. Default: false
  TORCH_ARG(bool, measure_waits) = false;
  /// Optional veto: return false to keep an otherwise eligible tensor on the device.
  /// Default: nullptr (no veto)
  TORCH_ARG(std::function<bool(const at::Tensor&)>, filter) = nullptr;
};

/// Counters of a SwapManager since its creation or the last reset_stats().
///
/// Example:
/// ```
/// recompose::SwapStats s = manager->stats();
/// std::cout << s.bytes_offloaded << " bytes out, " << s.late_reloads << " late reloads\n";
/// ```
struct SwapStats {
  int64_t tensors_offloaded = 0;  ///< copies to host memory launched
  int64_t bytes_offloaded = 0;    ///< their bytes
  int64_t tensors_reloaded = 0;   ///< copies back to the device launched
  int64_t bytes_reloaded = 0;     ///< their bytes
  int64_t tensors_kept = 0;       ///< saved tensors that policies left on the device (not eligible)
  int64_t bytes_kept = 0;         ///< their bytes
  int64_t shared_offloads = 0;    ///< saves of a tensor already offloaded: no second copy was made
  int64_t prefetched = 0;         ///< reloads launched before the tensor was asked for
  /// Reloads launched because the tensor was asked for (not prefetched)
  int64_t sync_loads = 0;
  int64_t late_reloads = 0;   ///< reloads launched but not landed when asked for
  int64_t early_returns = 0;  ///< asked for while the copy to host was still in flight: no reload
  int64_t pool_hits = 0;      ///< host buffers reused from the pool
  int64_t pool_misses = 0;    ///< host buffers allocated
  int64_t groups = 0;         ///< groups opened (explicit and implicit)
  /// Offloads that waited for older groups' copies (SwapOptions::max_groups_in_flight).
  int64_t offload_waits = 0;
  /// Host time spent waiting for copies: synchronous copies (CPU tensors, pageable memory),
  /// offload_waits and, with SwapOptions::measure_waits, reloads that had not landed when needed.
  double wait_seconds = 0;
};

/// Where the data of a SwappedTensor is.
enum class SwapState {
  Offloading,  ///< copy to host launched; the device tensor is still held
  Offloaded,   ///< in host memory only
  Reloaded,    ///< copy back launched (it may still be in flight); host copy kept
  Released,    ///< release() was called: no data
};

/// One tensor offloaded by a SwapManager (SwapManager::offload). Thread-safe. Destroying the last
/// handle releases it.
///
/// Example:
/// ```
/// std::shared_ptr<recompose::SwappedTensor> s = manager->offload(activation);
/// activation.reset();              // the device memory goes once the copy has landed
/// s->prefetch();                   // start bringing it back early
/// at::Tensor back = s->get();      // same device, sizes, strides and dtype
/// ```
class SwappedTensor : public std::enable_shared_from_this<SwappedTensor> {
 public:
  ~SwappedTensor();
  SwappedTensor(const SwappedTensor&) = delete;
  SwappedTensor& operator=(const SwappedTensor&) = delete;

  /// The tensor, on its original device, with its original sizes, strides and dtype, detached.
  /// If its reload was not launched yet, launches it now (a synchronous load, counted in
  /// SwapStats::sync_loads); marks its group as used, which prefetches earlier groups. The
  /// current stream of the calling thread waits for the copy. Can be called again (backward
  /// with retain_graph): it reloads again. Throws CheckpointError after release().
  ///   at::Tensor t = swapped->get();
  at::Tensor get();
  /// Launches the reload now, if it is not launched yet; does not wait. Throws CheckpointError
  /// after release().
  void prefetch();
  /// Frees the host copy (back to the pool) and any device copy; get() throws afterwards.
  void release();

  /// Where its data is now (see SwapState).
  SwapState state() const;
  /// Bytes of the tensor.
  int64_t nbytes() const;
  /// The swap group it belongs to (SwapManager::begin_group ids).
  int64_t group() const;
  /// The device it came from, and goes back to.
  c10::Device device() const;

 private:
  friend struct detail::SwapAccess;
  SwappedTensor(std::shared_ptr<detail::SwapCore> core, std::unique_ptr<detail::SwapEntry> entry);

  // A handle: the state (where the data is, buffers, copies) lives in lib/swap.
  std::shared_ptr<detail::SwapCore> core_;
  std::unique_ptr<detail::SwapEntry> entry_;
};

class SwapManager;

/// RAII swap group: tensors offloaded on the thread that opened it while it is alive, and not
/// inside a more recently opened group, belong to it (groups are per thread: threads sharing a
/// manager do not mix theirs). Groups should follow the order of the forward (one per layer):
/// backward reloads them in reverse order. Must be destroyed in LIFO order, on the thread that
/// created it; otherwise a warning says what was wrong and the group is closed anyway (a
/// destructor cannot throw). The scope keeps the manager's state alive: the manager handle may
/// go first.
///
/// Example:
/// ```
/// { recompose::SwapGroupScope group(*manager); y = layer(x); }
/// ```
class SwapGroupScope {
 public:
  /// Opens a group of `manager` (SwapManager::begin_group).
  explicit SwapGroupScope(SwapManager& manager);
  /// Closes it (SwapManager::end_group), warning instead of throwing on a misuse.
  ~SwapGroupScope();
  SwapGroupScope(const SwapGroupScope&) = delete;
  SwapGroupScope& operator=(const SwapGroupScope&) = delete;
  /// The group's id (SwappedTensor::group).
  int64_t id() const { return id_; }

 private:
  std::shared_ptr<detail::SwapCore> core_;
  int64_t id_;
};

/// Offloads tensors to host memory and brings them back. One manager serves one training loop
/// (one forward at a time); its state is shared by all threads (backward may run on autograd
/// device threads) and thread-safe. Concurrent forwards on several threads are best given a
/// manager each; sharing one is correct (explicit groups are per thread) but their implicit
/// groups mix, which blurs prefetching. Create with SwapManager::create. Every object that uses
/// the manager's state (AsyncSaveOnCpu, SwapGroupScope, SwappedTensor, saved tensors) keeps it
/// alive, so the last handle may go at any time.
///
/// Example:
/// ```
/// auto manager = recompose::SwapManager::create(recompose::SwapOptions().prefetch_groups(2));
/// { recompose::AsyncSaveOnCpu offload(manager); loss = model(x).sum(); }
/// loss.backward();
/// std::cout << manager->stats().bytes_offloaded << " bytes went to host memory\n";
/// ```
class SwapManager {
 public:
  /// A new manager with `options`. Throws std::invalid_argument for invalid options (see
  /// SwapOptions).
  ///   auto manager = recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0));
  static std::shared_ptr<SwapManager> create(SwapOptions options = {});
  /// The process-wide manager used where none is given (AsyncSaveOnCpu, swap_inputs,
  /// apply_offload, MUST_SWAP). Created with default options on first use and never destroyed.
  static std::shared_ptr<SwapManager> default_manager();

  ~SwapManager();
  SwapManager(const SwapManager&) = delete;
  SwapManager& operator=(const SwapManager&) = delete;

  /// The options it was created with.
  const SwapOptions& options() const;

  /// Opens a group on this thread and returns its id (increasing in forward order). Prefer
  /// SwapGroupScope.
  int64_t begin_group();
  /// Closes the group `id`, which must be the innermost open one of this thread; throws
  /// CheckpointError otherwise (naming the group in the way).
  void end_group(int64_t id);

  /// Whether a policy offloads `tensor` (see the header comment for what stays on the device).
  bool eligible(const at::Tensor& tensor) const;
  /// Starts copying `tensor` to host memory in the current group and returns its handle; the
  /// caller drops its own references to let device memory go. Offloading a tensor again while
  /// its first offload is alive (same storage, sizes, strides and version) shares the copy.
  /// Does not check eligible(). Throws CheckpointError for a tensor it cannot copy: undefined,
  /// not strided, nested, quantized, on the meta device, or without storage.
  ///   std::shared_ptr<recompose::SwappedTensor> s = manager->offload(activation);
  ///   activation.reset();
  ///   ... at::Tensor back = s->get();
  std::shared_ptr<SwappedTensor> offload(const at::Tensor& tensor);

  /// Lets go of device tensors whose copy to host has landed. Called at every offload and group
  /// boundary; call it yourself to free memory at another point.
  void poll();
  /// Waits on the host for every copy in flight, and for the streams reloaded tensors were handed
  /// to (for those nobody holds any more), then polls. Throws CheckpointError while the current
  /// stream is being captured into a CUDA graph.
  void synchronize();

  /// The counters since creation or the last reset_stats() (see SwapStats).
  SwapStats stats() const;
  /// Sets the counters to zero.
  void reset_stats();
  /// Idle bytes in the host buffer pool.
  int64_t pool_bytes() const;
  /// Frees the idle host buffers of the pool.
  void clear_pool();
  /// Offloaded tensors alive (any state but Released), and their bytes. The manager's own
  /// bookkeeping of a tensor and of its group is freed with it (release, or its last holder
  /// gone): nothing accumulates over steps, also in the default manager.
  int64_t tensors_alive() const;
  int64_t bytes_alive() const;  ///< see tensors_alive

 private:
  friend struct detail::SwapAccess;
  explicit SwapManager(SwapOptions options);
  std::shared_ptr<detail::SwapCore> core_;
};

/// RAII: every tensor saved for backward on this thread while it is alive is offloaded through
/// `manager` (when eligible) and reloaded in backward (PyTorch's torch.autograd.graph.save_on_cpu,
/// with asynchronous copies and prefetch). Tensors saved inside checkpointed regions are not
/// (the regions keep none); the inputs of a region are. Closes the current implicit group on
/// entry and on exit. Holds the manager: it lives at least as long as the scope.
///
/// Threads: scopes are per thread. Several threads may each run their own forward under their
/// own AsyncSaveOnCpu, with a manager each (supported, concurrently). Threads may also share
/// one manager (see SwapManager).
///
/// Misuse: it must be destroyed on the thread that created it, in LIFO order with the other
/// saved-tensor scopes of that thread (SavedTensorMeter, checkpointed regions, other
/// AsyncSaveOnCpu). A scope destroyed out of order or on another thread is closed all the same
/// (nothing dangles, the other scopes keep working), and the next recompose call on the thread
/// that created it (a tensor saved for backward, a new scope) throws CheckpointError saying what
/// was closed wrongly and how to fix it.
///
/// Throws CheckpointError if another autograd engine is installed, or if a misuse of this
/// thread's scopes is pending.
///
/// Example:
/// ```
/// { recompose::AsyncSaveOnCpu offload; loss = model(x).sum(); }   // default manager
/// loss.backward();
/// ```
class AsyncSaveOnCpu {
 public:
  /// Opens the scope on this thread, offloading through `manager` (null:
  /// SwapManager::default_manager()).
  explicit AsyncSaveOnCpu(std::shared_ptr<SwapManager> manager = nullptr);
  ~AsyncSaveOnCpu();
  AsyncSaveOnCpu(const AsyncSaveOnCpu&) = delete;
  AsyncSaveOnCpu& operator=(const AsyncSaveOnCpu&) = delete;

  /// The manager it offloads through.
  SwapManager& manager() const { return *manager_; }

 private:
  struct Scope;
  std::shared_ptr<SwapManager> manager_;
  std::unique_ptr<Scope> scope_;
};

}  // namespace recompose
