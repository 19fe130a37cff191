// ForwardSummary: a selective region's forward, op by op, as its ForwardTrace recorded it. The
// tools that explain or price a policy (inspect_policy, the planner's profiler) read it instead
// of recording the forward a second time; summarize(trace) makes it when the forward ends, for
// contexts made with a SummarySink (summarizing_contexts.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace recompose::detail {

struct SummaryOp {
  enum class Kind : uint8_t {
    Decided,       // returns new tensors: shown to the policy
    Write,         // in place or out=: writes into an argument, hidden from the policy
    View,          // returns an alias of an argument, hidden from the policy
    AutocastCast,  // autocast's cached cast of a parameter, hidden from the policy
  };
  SummaryOp(const c10::OperatorHandle& o, Kind k) : op(o), kind(k) {}
  c10::OperatorHandle op;
  Kind kind;
  // The calls of its op before it (SelectiveCheckpointContext::call_index); an autocast cast is
  // none of its op's calls: the index the op's next call gets.
  int64_t call_index = 0;
  int64_t output_bytes = 0;  // bytes of the storages of its outputs, each once (aliases too)
  // Of a Decided op: the Decided ops (indices into ForwardSummary::ops, ascending, each once)
  // that created the storages it reads (a view reads its base's creator, a read after an
  // in-place write still names the creator; through an autocast cast, what it cast), and those
  // that the later writes into its own outputs read (a replay running it runs them too). An op
  // of another order may appear: a write can read what was made after the op.
  std::vector<uint32_t> reads;
  bool saved_for_backward = false;  // autograd saved a tensor of a storage it created
  // Of a Write that draws (dropout's bernoulli_ on CPU): the bits its draw is kept as (DrawMask);
  // of a native_dropout: its kept draw (bits on CPU, the bool mask on CUDA; DropoutDraw). The
  // region holds them, whatever the policy keeps, until it is rebuilt.
  int64_t draw_bytes = 0;
  // Of a Write that draws, kept as bits: the host seconds its op took in the forward, which a
  // replay does not spend (it writes the draw back). The planner's profile takes it out of the
  // time of the op that follows (Note [ A kept draw is no op's recomputation ], op_times.cpp).
  double draw_seconds = 0;
  // Of an AutocastCast: the bytes of the cast the region keeps for its replay (0: not kept, cast
  // again there). Note [ Parameter casts kept for the replay ] (parameter_casts.h).
  int64_t kept_cast_bytes = 0;
  // A later op of the region wrote into a storage of its outputs (created by it, or aliased).
  bool written_after = false;
  // Written after, and its kept output, were it the only one kept, would carry every such write
  // (it created those storages, draws nothing, and nothing read them before each write): keeping
  // it costs no copy. See ForwardTrace::carry_write.
  bool carries_writes = false;
};

struct ForwardSummary {
  std::vector<SummaryOp> ops;  // in the order they ran (ignored ops left out)
  // Why the region's backward would run its forward again rather than replay (the replay plan's
  // reason, with every saved tensor needed and the RNG state preserved); empty when it would
  // replay. Decided from the trace, as the backward decides before the replay runs.
  std::string replay_fallback;
  // The summary could not be made (out of host memory): `ops` is empty, and says nothing.
  bool failed = false;
};

class ForwardTrace;

// The forward op by op, from what `trace` recorded; complete only when the trace was set to
// record_summary(true) before the forward (views and output bytes are missing else).
ForwardSummary summarize(const ForwardTrace& trace);

// Receives a region's summary when its forward ends (on the forward's thread).
using SummarySink = std::function<void(ForwardSummary&&)>;

}  // namespace recompose::detail
