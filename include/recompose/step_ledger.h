// StepLedger: what one training step did with its checkpointed regions, region by region.
//
// While a ledger is alive on a thread, every checkpointed region whose forward begins on that
// thread (apply_checkpoint, checkpoint(fn), checkpoint_sequential's segments; nested regions
// too) gets a row, in forward order, and backward fills in how it rebuilt the region:
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
//                " + swap inputs" when swap_inputs is on;
//   bytes held   the device bytes the region left held for backward when its forward ended,
//                each storage once in the whole ledger (the first region holding it has it), as
//                SavedTensorMeter counts: its inputs (when saved as autograd saves them; a nested
//                region's inputs are its parent's to recompute, and inputs an outer swap or
//                offload policy takes count as that policy charges the meters), the outputs a
//                selective policy keeps and its kept draws. Parameters are not counted;
//   rebuilt      what backward did: "replayed" (selective replay: ops run, skipped, substituted,
//                draws written back, writes carried), "ran the forward again" (with the reason,
//                for a selective region that fell back), or "not rebuilt yet" (backward has not
//                reached it, or the ledger was read or destroyed before); the host time of the
//                rebuilds, and how many (retain_graph: a second backward rebuilds again).
// Bytes moved by swap and offload are not in the ledger yet (see offload_report and SwapStats).
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

// One row of a StepLedger: one checkpointed region invocation.
struct LedgerRegion {
  int depth = 0;       // 0 for a region begun outside any other, 1 inside one, ...
  std::string name;    // see StepLedger
  std::string mode;    // "full", "selective", "custom contexts" (+ " + swap inputs")
  std::string inputs;  // "held", "enclosing region" (recomputed by it), "outer policy"
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
  // "replayed", "ran the forward again", "replayed and ran the forward again" or
  // "not rebuilt yet".
  std::string rebuilt() const;
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

  struct State;

 private:
  std::shared_ptr<State> state_;
};

std::ostream& operator<<(std::ostream& out, const StepLedger& ledger);

// mark(label) on the ledger alive on this thread; nothing when none is (code that runs the step
// but does not own the ledger: ledger_mark("backward") before loss.backward()).
void ledger_mark(const std::string& label);

}  // namespace recompose
