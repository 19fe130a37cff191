// StepLedger: what one training step did with its checkpointed regions, region by region.
//
// While a ledger is alive on a thread, every checkpointed region whose forward begins on that
// thread (apply_checkpoint, checkpoint(fn), checkpoint_sequential's segments; nested regions
// too) and every call of a module with apply_offload gets a row, in forward order, and backward
// fills in how it rebuilt the region and what swap brought back:
//
//   recompose::StepLedger ledger(*model);  // the root names the modules ("blocks.3")
//   auto loss = model->forward(x).sum();
//   loss.backward();
//   std::cout << ledger;                   // a table with a totals line; ledger.json() for tools
//
// Each row says
//   name         the module's qualified name in the ledger's root and its type ("blocks.0
//                (BlockImpl)"); without a root, or for a module outside it, its type; a
//                checkpoint(fn) region "checkpoint #k" (k-th such region of the ledger), or
//                "checkpoint(a, b)" when it names its modules in state_modules (a segment of
//                checkpoint_sequential lists its modules);
//   mode         "full", "selective" (a policy), "custom contexts" (context_fn), with
//                " + swap inputs" when swap_inputs is on and " + offload" when the module also
//                has apply_offload (one row for both); "offload" for a module with
//                apply_offload only (not checkpointed: nothing to rebuild). In C++ the enum
//                LedgerMode and the flags swap_inputs, offloaded (mode_text() joins them);
//   bytes held   the device bytes the region left held for backward when its forward ended,
//                each storage once in the whole ledger (the first region holding it has it), as
//                SavedTensorMeter counts: its inputs (when saved as autograd saves them; a nested
//                region's inputs are its parent's to recompute, and inputs an outer swap or
//                offload policy takes count as that policy charges the meters), the outputs a
//                selective policy keeps and its kept draws. Parameters are not counted;
//   rebuilt      what backward did (LedgerRebuilt): "replayed" (selective replay: ops run,
//                skipped, substituted, draws written back, writes carried), "ran the forward
//                again" (with the reason, for a selective region that fell back), or "not
//                rebuilt yet" (backward has not
//                reached it, or the ledger was read or destroyed before); the host time of the
//                rebuilds, and how many (retain_graph: a second backward rebuilds again);
//   plan         for a module apply_plan configured: what the plan chose for it and the plan's
//                estimate of the bytes it holds, beside bytes held (the measurement);
//   moved        what swap and offload copied for the row's saved tensors (MUST_SWAP outputs,
//                swap_inputs inputs, apply_offload's tensors), whenever the copies ran: tensors
//                and bytes to host and back, the GB/s of those copies (bytes over the summed
//                host time from each launch to its landing seen: exact on CPU; on a device a
//                lower bound, copies queued behind others counting their wait), reloads
//                prefetched, loaded when asked for or late (those stalled compute) and the
//                host's wait; the same events SwapStats counts for the whole manager;
//   kept         the saved tensors swap or offload left on the device, per reason (counts and
//                bytes): "below min_bytes", "parameter", "part of a larger storage", "not
//                supported", "rejected by the filter", "policy", "over the copy window", "asked
//                for before it left". A SavedTensorMeter says 0.07x of plain while nothing moved?
//                The rows say "156 tensors kept: below min_bytes".
//
//   recompose::apply_offload(block, recompose::OffloadOptions().manager(manager));
//   recompose::StepLedger ledger(*model);
//   model->forward(x).sum().backward();
//   ledger.regions()[0].swap.bytes_offloaded;  // what blocks.0's call sent to host memory
//
// The memory timeline (timeline(), and a section under the table; write_svg draws it): the memory
// in use on the ledger's device (the root's first parameter's; CPU without a root) sampled at the
// ledger's start, at each region's forward begin and end, at each rebuild's begin and end, at each
// mark (mark(), ledger_mark()) and when the timeline is read. On a CUDA device the caching
// allocator's allocated bytes; on CPU the counting allocator's while recompose::CpuMemoryCounting
// is on (include/recompose/cpu_memory_counting.h); otherwise "not measured" (the marks, without
// bytes). Each sample also reads the allocator's peak since its last reset: the step's peak is the
// last one (call reset_peak_device_memory before the step), reached between the last sample whose
// peak reading was lower and the next; the largest holders there are the rows holding the most
// bytes (as bytes held counts them: inputs stay charged until the ledger ends) at whichever of
// those two samples had more in use. The forward/backward turn is the first mark named
// "backward", else the first rebuild's begin (which comes after backward has begun: mark it for
// the exact point).
//
// Cost: with no ledger alive, each hook is one relaxed atomic load; results are bitwise the same
// with and without a ledger (it reads, never changes, what the step does).
//
// Out of memory: a c10::OutOfMemoryError raised in a recorded region's forward or rebuild leaves
// it with the ledger's view at that moment appended to its message (explain_out_of_memory()),
// once; its type and the allocator's own message are unchanged.
//
// Rules: one ledger per thread at a time (a second throws CheckpointError). Destroy it on the
// thread that made it; a ledger destroyed elsewhere stops recording all the same, and nothing
// dangles. Rows outlive the ledger inside the autograd graph; what backward does after the
// ledger is gone is not recorded. Reading a ledger (regions(), str(), json()) while backward
// runs on another thread is safe.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose {

// Saved tensors of a row that stayed on the device under swap or offload, for one reason.
struct LedgerKept {
  std::string reason;  // see LedgerRegion::kept
  int64_t tensors = 0;
  int64_t bytes = 0;
};

// What swap and offload moved for one row's saved tensors (MUST_SWAP outputs, swap_inputs
// inputs, apply_offload's tensors), on whatever thread the copies ran: the same events SwapStats
// counts for a whole manager, per row.
struct LedgerSwap {
  int64_t tensors_offloaded = 0;  // copies to host launched
  int64_t bytes_offloaded = 0;
  int64_t tensors_reloaded = 0;  // copies back to the device launched
  int64_t bytes_reloaded = 0;
  int64_t prefetched = 0;    // reloads launched before backward asked for the tensor
  int64_t sync_loads = 0;    // reloads launched when backward asked for it: compute waited
  int64_t late_reloads = 0;  // reloads not landed when backward asked: compute waited
  // Host time spent in synchronous copies (CPU tensors, pageable memory) and waits for them:
  // copies to host, and copies back (with SwapOptions::measure_waits, waits for late reloads).
  int64_t offload_wait_ns = 0;
  int64_t reload_wait_ns = 0;
  // Copies seen landed and the host time from each launch until recompose saw it landed, summed:
  // exact on CPU (synchronous copies, one at a time); on a device an upper bound (seen at the
  // next poll, or when backward asked; a copy queued behind others counts its wait), so the
  // bandwidths below are lower bounds there, the lower the more copies were in flight together.
  int64_t bytes_to_host_landed = 0;
  int64_t to_host_ns = 0;
  int64_t bytes_to_device_landed = 0;
  int64_t to_device_ns = 0;

  // Achieved bandwidths of the copies seen landed, in GB/s (1e9 bytes); 0 when none landed.
  double to_host_gb_per_s() const;
  double to_device_gb_per_s() const;
  // Whether a reload made compute wait: launched when asked for, or not landed by then.
  bool reload_stalled() const { return sync_loads + late_reloads > 0; }
  bool any() const { return tensors_offloaded + tensors_reloaded != 0; }
  LedgerSwap& operator+=(const LedgerSwap& other);
};

// How a row's region recomputes: checkpointing of every op ("full"), a SelectivePolicy
// ("selective"), a context_fn ("custom contexts"); "offload" for a call of a module with
// apply_offload only (not checkpointed). to_string gives the words in quotes.
enum class LedgerMode { Full, Selective, CustomContexts, Offload };

// How a row's inputs are saved for backward: held by the region as autograd saves them ("held"),
// recomputed by the enclosing region ("enclosing region"), taken by an outer swap or offload
// policy ("outer policy"); "-" (None) for an apply_offload call, or before the forward saved them.
enum class LedgerInputs { Held, EnclosingRegion, OuterPolicy, None };

// What backward did to a row (LedgerRegion::rebuilt): "replayed", "ran the forward again",
// "replayed and ran the forward again" (two backwards, retain_graph), "not rebuilt yet",
// "not checkpointed" (apply_offload only).
enum class LedgerRebuilt {
  Replayed,
  RanForwardAgain,
  ReplayedAndRanForwardAgain,
  NotRebuiltYet,
  NotCheckpointed
};

std::string to_string(LedgerMode mode);
std::string to_string(LedgerInputs inputs);
std::string to_string(LedgerRebuilt rebuilt);

// One row of a StepLedger: one checkpointed region invocation, or one call of a module with
// apply_offload only.
struct LedgerRegion {
  int depth = 0;     // 0 for a region begun outside any other, 1 inside one, ...
  std::string name;  // see StepLedger
  LedgerMode mode = LedgerMode::Full;
  bool swap_inputs = false;  // the region's swap_inputs option: its inputs go to host memory
  bool offloaded = false;    // a checkpointed module that also has apply_offload (one row)
  LedgerInputs inputs = LedgerInputs::None;
  int64_t bytes_held = 0;
  int64_t rebuilds = 0;         // recomputations (one per backward that needed the region)
  int64_t replays = 0;          // of which answered by the selective replay
  int64_t reruns = 0;           // of which ran the forward again
  std::string fallback_reason;  // why the last rerun of a selective region did not replay
  int64_t ops_run = 0;          // by the replays
  int64_t ops_skipped = 0;
  int64_t ops_substituted = 0;
  int64_t draws_written = 0;
  int64_t writes_carried = 0;
  int64_t host_ns = 0;  // host time of the rebuilds (replays, forwards run again)
  // A selective region with a save list (SelectivePolicy of op names): the names that no op of
  // its forward matched (they kept nothing here; a composite op such as aten::linear is refused
  // when the policy is made).
  std::vector<std::string> unmatched_policy_names;
  // False for a call of a module with apply_offload only (mode "offload"): nothing to rebuild.
  bool checkpointed = true;
  // A module configured by apply_plan: what the plan chose for it ("full", "selective (keeps 2
  // op outputs, swaps 0)", "offload", "full-swap-inputs") and the plan's estimate of the bytes it
  // holds for backward (ModulePlan::bytes), beside the measured bytes_held. "" and -1 otherwise.
  std::string plan_entry;
  int64_t plan_bytes = -1;

  // What swap and offload moved for the row's saved tensors (see LedgerSwap).
  LedgerSwap swap;
  // Saved tensors that stayed on the device under swap or offload, per reason, in the order
  // first seen: "below min_bytes" (SwapOptions::min_bytes), "parameter", "part of a larger
  // storage", "not supported", "rejected by the filter" (SwapManager::eligible's rules),
  // "policy" (apply_offload's ActivationPolicy::SAVE), "over the copy window" (never-stall),
  // "asked for before it left" (apply_offload's last call, keep_last_on_device). Those on the
  // device are in bytes_held (parameters are not). Counted per saved tensor: two saves of one
  // tensor are two here, one storage in bytes_held.
  std::vector<LedgerKept> kept;

  // What backward did, from the counts above (to_string(rebuilt()) for the words).
  LedgerRebuilt rebuilt() const;
  // The mode as the table prints it: "full", "selective + swap inputs", "full + offload", ...
  std::string mode_text() const;
  int64_t tensors_kept() const;
  int64_t bytes_kept() const;
};

// One sample of the memory timeline.
struct LedgerMark {
  // "start" (the ledger made), "forward begin", "forward end", "rebuild begin", "rebuild end",
  // "mark" (StepLedger::mark, ledger_mark) or "read" (when the timeline was read).
  std::string kind;
  std::string label;   // the region's name, or the mark's
  int region = -1;     // index in regions(); -1 for start, mark and read
  int64_t bytes = -1;  // in use on the ledger's device; -1 not measured
  int64_t peak = -1;   // the allocator's peak since its last reset; -1 not measured
};

// A region holding bytes at the step's peak.
struct LedgerHolder {
  int region = -1;  // index in regions()
  std::string name;
  int64_t bytes = 0;
};

struct LedgerTimeline {
  std::string device;  // "cpu", "cuda:0"
  std::string source;  // "CUDA caching allocator", "CPU counting allocator"; "" not measured
  std::vector<LedgerMark> marks;
  int turn = -1;            // index in marks where backward starts; -1 not reached
  int64_t peak_bytes = -1;  // the step's peak; -1 not measured
  // The peak was reached after marks[peak_mark - 1] and by marks[peak_mark]; 0: at or before the
  // first mark (before the ledger: reset the peak before the step). -1 not measured.
  int peak_mark = -1;
  std::vector<LedgerHolder> holders;  // at the peak, most bytes first (at most 5)
  // At the turn: what the rows hold then (as bytes held counts them; an offloaded call's
  // tensors that left are no longer held: what stays until backward), and the rest of the
  // memory in use (parameters, optimizer state, autograd's saved tensors outside the regions,
  // the forward's outputs: whatever else the allocator counts). -1 when backward was not reached;
  // rest_at_turn also when the memory is not measured.
  int64_t regions_at_turn = -1;
  int64_t rest_at_turn = -1;
  bool measured() const { return !source.empty(); }
};

class StepLedger {
 public:
  // Starts recording the regions of this thread. With `root`, regions of modules in its tree are
  // named by their qualified names (named_modules, taken now). Throws CheckpointError if a
  // ledger is alive on this thread already.
  StepLedger();
  explicit StepLedger(const torch::nn::Module& root);
  ~StepLedger();
  StepLedger(const StepLedger&) = delete;
  StepLedger& operator=(const StepLedger&) = delete;

  // The rows so far, in forward order.
  std::vector<LedgerRegion> regions() const;
  // Sum of the rows' bytes_held (each storage once).
  int64_t bytes_held() const;
  // The table (one line per region, then a totals line).
  std::string str() const;
  // The same as a JSON object: {"regions": [{...}, ...], "totals": {...}}.
  std::string json() const;
  // The ledger's view for an out-of-memory error raised now on this thread: where in the step
  // (the forward of which region, backward's rebuild of which, or outside any region), what the
  // regions hold for backward (the largest first), and what they could hold less. recompose
  // appends it to a c10::OutOfMemoryError that leaves a region's forward or rebuild while a
  // ledger records the region; for one raised elsewhere in the step (the loss, the optimizer):
  //   catch (c10::OutOfMemoryError& e) { e.add_context(ledger.explain_out_of_memory()); throw; }
  std::string explain_out_of_memory() const;

  // The memory timeline so far, with a "read" sample taken now (see above).
  LedgerTimeline timeline() const;
  // Adds a mark to the timeline ("backward" marks the turn).
  void mark(const std::string& label);
  // Writes the timeline as an SVG image: memory over the marks, region boundaries, the turn and
  // the peak. Throws CheckpointError if the file cannot be written. svg() returns the text.
  void write_svg(const std::string& path) const;
  std::string svg() const;

  // The step as a Chrome trace, the JSON that Perfetto (ui.perfetto.dev) and chrome://tracing
  // open: a slice per row's forward and per rebuild ("recompose: regions" track), a slice per
  // swap copy from its launch to its landing seen ("recompose: swap copies"), the marks as
  // instants, and counters: "recompose: held for backward by the regions" (the rows' bytes at
  // each sample), "recompose: device memory" ("in use" and "peak since reset", when measured)
  // and "recompose: swap" ("in flight", "on host"). Timestamps are on the system clock, LibTorch
  // profiler's: the trace's baseTimeNanoseconds is the ledger's start.
  std::string chrome_trace() const;
  // Writes chrome_trace() to `path`. With `profiler_trace`, the path of a Chrome trace LibTorch's
  // profiler saved (torch::autograd::profiler::ProfilerResult::save), the ledger's events are
  // added to the profiler's, on its clock, and the whole is written to `path` (it may be the same
  // file): one trace with the kernels and recompose's decisions.
  //   ledger.write_chrome_trace("trace.json", "trace.json");
  // Throws CheckpointError if a file cannot be read or written or `profiler_trace` is no Chrome
  // trace (a JSON object with a traceEvents array).
  void write_chrome_trace(const std::string& path, const std::string& profiler_trace = "") const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

std::ostream& operator<<(std::ostream& out, const StepLedger& ledger);

// mark(label) on the ledger alive on this thread; nothing when none is (code that runs the step
// but does not own the ledger: ledger_mark("backward") before loss.backward()).
void ledger_mark(const std::string& label);

}  // namespace recompose
