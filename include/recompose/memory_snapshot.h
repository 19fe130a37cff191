// Memory snapshots that pytorch.org/memory_viz opens, with recompose's decisions in them.
//
//   recompose::CpuMemoryCounting counting;          // on CPU: the allocator that records
//   recompose::record_memory_history(true);         // torch.cuda.memory._record_memory_history()
//   train_step();
//   recompose::dump_memory_snapshot("snapshot.pickle");  // torch.cuda.memory._dump_snapshot()
//   recompose::record_memory_history(false);
//
// Drag snapshot.pickle onto https://pytorch.org/memory_viz: "Active Memory Timeline" shows each
// allocation of the step over time, "Allocator State History" each alloc and free.
//
// What is recorded: every allocation and free of the device's allocator while recording, with
// its address, size and time. On CUDA it is the caching allocator's own history
// (c10::cuda::CUDACachingAllocator::recordHistory, every CUDA device) and the dump is its
// snapshot, as torch::cuda::_memory_snapshot_pickled writes it. On CPU it is the counting
// allocator's (recompose/cpu_memory_counting.h, which must be alive), written in the same format:
// one device, each allocation its own segment (the CPU allocator caches nothing).
//
// recompose's decisions: while recording, the thread that called record_memory_history(true)
// is listened to as a StepLedger is (the events of the regions that begin on it, wherever their
// rebuilds and copies run), and each trace entry carries, as its user metadata, what recompose
// was doing when the allocator made it: "forward: #k <module type> (<mode>)" in a checkpointed
// region's forward (or an offloaded call), "replay: #k ..." while backward rebuilds a region by
// the selective replay, "rerun: #k ..." while it runs the region's forward again, "pack: #k ..."
// while a saved tensor of the region is copied to host (its buffer taken and its copy launched),
// "reload: #k ..." while it is copied back; none elsewhere. #k numbers the regions in the order
// their forwards began (as the ledger's rows, counting an offloaded call and the region of its
// module twice). On CUDA the caching allocator takes the text with setUserMetadata. On CPU each
// entry also has a category, the word before the colon, which memory_viz colours by; an
// allocation a region held for backward (its inputs, the outputs a selective policy keeps, as
// SavedTensorMeter counts them) has the category "held for backward" and its user metadata ends
// with "; held for backward by #k ..." (the dropout draws a selective region keeps as bits are no
// allocation of their own: not marked); entries with no decision have the category "unknown".
// docs/guide/ledger.md has the list and a worked example.
//
// Cost: nothing while no recording is on (the counting allocator checks one flag per allocation
// and free; the events, one relaxed load per emission point); recording on CPU, an entry per
// allocation and free (a few hundred bytes with its metadata).
//
// Rules: one recording in the process at a time. The user metadata is the allocator's, one for
// the whole process: work on other threads at the same moment carries it too.
#pragma once

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace recompose {

/// What record_memory_history records.
///
/// Example:
/// ```
/// recompose::record_memory_history(
///     true, recompose::MemoryHistoryOptions().device(torch::kCUDA).max_entries(100000));
/// ```
struct MemoryHistoryOptions {
  /// Whose allocations: c10::kCPU (the counting allocator; a CpuMemoryCounting must be alive), or
  /// a CUDA device (the caching allocator's history of every CUDA device). Default: CPU
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// The most trace entries kept; older ones are dropped first (torch's max_entries). Must be
  /// positive. Default: 1,000,000
  TORCH_ARG(int64_t, max_entries) = 1000000;
  /// When stopping (record_memory_history(false, ...)): drop the history too (torch's
  /// clear_history); a dump then throws, as if nothing had been recorded. Default: false
  TORCH_ARG(bool, clear_history) = false;
};

/// Starts (`enabled`) or stops recording the allocator's history with recompose's decisions as
/// user metadata (see the header comment). Starting drops the history of a previous recording;
/// stopping keeps it for dump_memory_snapshot unless `options.clear_history()`; stopping when
/// nothing records does nothing (but still clears with clear_history).
/// Throws CheckpointError if a recording is on already (stop it first), if `options.device` is
/// CPU and no recompose::CpuMemoryCounting is alive, if it is CUDA in a build without CUDA, if it
/// is another device type, or if max_entries is not positive.
///
/// Example:
/// ```
/// recompose::CpuMemoryCounting counting;
/// recompose::record_memory_history(true);
/// train_step();
/// recompose::record_memory_history(false);
/// recompose::dump_memory_snapshot("snapshot.pickle");
/// ```
void record_memory_history(bool enabled, const MemoryHistoryOptions& options = {});

/// Whether a recording is on.
///
/// Example:
/// ```
/// if (!recompose::recording_memory_history()) recompose::record_memory_history(true);
/// ```
bool recording_memory_history();

/// The snapshot of the last recording (the one on, or the last one stopped) as the pickle bytes
/// memory_viz reads: a dict with "segments" (the allocations alive now), "device_traces" (one
/// list of trace entries per device: "action", "addr", "size", "stream", "time_us" since the
/// epoch, "frames", "compile_context", "user_metadata", and on CPU "category"),
/// "allocator_settings" and "external_annotations", as torch::cuda::_memory_snapshot_pickled.
/// Throws CheckpointError if no recording was started in this process (or the last was stopped
/// with clear_history).
///
/// Example:
/// ```
/// std::string bytes = recompose::memory_snapshot();   // Python: pickle.loads(bytes)
/// ```
std::string memory_snapshot();

/// Writes memory_snapshot() to `path`, the file to open at https://pytorch.org/memory_viz.
/// Throws CheckpointError if no recording was started in this process (or the last was stopped
/// with clear_history), or if `path` cannot be written (the message names it).
///
/// Example:
/// ```
/// recompose::dump_memory_snapshot("out/snapshot.pickle");
/// ```
void dump_memory_snapshot(const std::string& path);

}  // namespace recompose
