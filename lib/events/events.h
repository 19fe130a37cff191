// Events: what a step did with its checkpointed regions, emitted once by the code that does it
// and read by the sinks listening on the thread where the region began (the step ledger, the
// Chrome trace). As at::RecordFunction: producers emit, sinks register, and with no sink open
// anywhere each emission point costs one relaxed atomic load (listening()).
//
// A region (a checkpointed region's invocation, or a call of a module with apply_offload) is known
// to producers by an opaque RegionTag: the contexts the sinks listening when it began gave it.
// The region protocol holds its tag in the frame (its rebuilds are reported with it), swap keeps
// the tag of the region that saved a tensor with the tensor (its copies, on whatever thread they
// run, are reported with it). See Note [ Events and sinks ].
#pragma once

#include "events/kept_reason.h"
#include "events/replay_outcome.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::events {

// Note [ Events and sinks ]
// A sink registers on a thread (Sink::listen) and receives the events of the regions that begin
// on that thread while it listens: region_begun asks each such sink for its context of the region
// (null: not interested), and every later event of the region goes to the sinks that gave one,
// with their context, on whatever thread it happens (a copy landing, a rebuild in backward). A
// sink closed (Sink::close, on any thread) receives nothing more; tags still held by the autograd
// graph keep it alive, unread. Sinks are called under no lock of the producer's but may be called
// concurrently for different regions; each guards its own state.

// Sinks open in the process: the emission points' fast check.
extern std::atomic<int> g_sinks_open;
inline bool listening() { return g_sinks_open.load(std::memory_order_relaxed) != 0; }

// What a beginning region is.
enum class RegionKind : uint8_t {
  Full,            // checkpointed, no policy
  Selective,       // checkpointed with a selective policy
  CustomContexts,  // checkpointed with CheckpointOptions::context_fn
  OffloadCall,     // a call of a module with apply_offload (not checkpointed)
};

struct RegionBegun {
  RegionKind kind = RegionKind::Full;
  bool swap_inputs = false;  // CheckpointOptions::swap_inputs
  // The module whose forward it is (apply_checkpoint, apply_offload); null for checkpoint(fn).
  const torch::nn::Module* module = nullptr;
  // checkpoint(fn)'s CheckpointOptions::state_modules (the modules it names); null when none.
  const std::vector<std::shared_ptr<torch::nn::Module>>* state_modules = nullptr;
  // Begun inside a recomputation in backward (not a forward region of the step).
  bool in_recomputation = false;
};

// How a region's inputs were kept for backward, as the saved-tensor stack answered when it saved
// them.
enum class InputsSaved : uint8_t {
  Held,       // no policy or a SavedTensorMeter: kept on the device as autograd keeps them
  Enclosing,  // a region around this one saved them: it recomputes them (counted nowhere)
  Outer,      // another policy (swap, offload): counted only as that policy charges the meters
};

enum class CopyDirection : uint8_t { ToHost, ToDevice };

// Why a copy was launched.
enum class CopyCause : uint8_t {
  Offload,   // to host: the tensor was saved
  Prefetch,  // back: launched before backward asked for the tensor
  OnDemand,  // back: launched when backward asked for it (compute waits)
};

struct CopyLaunched {
  CopyDirection direction = CopyDirection::ToHost;
  CopyCause cause = CopyCause::Offload;
  int64_t bytes = 0;
  int64_t host_wait_ns = 0;  // host time the launch itself took (a synchronous copy: all of it)
};

struct CopyLanded {
  CopyDirection direction = CopyDirection::ToHost;
  int64_t bytes = 0;
  // Host time from the launch until the copy was seen landed: exact for a synchronous copy, an
  // upper bound on a device (seen at the next poll; queued copies count their wait).
  int64_t ns = 0;
};

// A reader of events. Each callback receives the context this sink gave the region.
class Sink : public std::enable_shared_from_this<Sink> {
 public:
  Sink() = default;
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;
  virtual ~Sink();

  // Starts receiving the events of regions that begin on this thread from now on.
  void listen();
  // Stops receiving events, on any thread; the sink's open count goes with it. Idempotent.
  void close();
  bool is_open() const { return open_.load(std::memory_order_acquire); }

  // A region begins on a listening thread: this sink's context for it (null: none). `enclosing`:
  // this sink's context of the region whose forward runs here (null if none).
  virtual std::shared_ptr<void> region_begun(const RegionBegun& event, void* enclosing) = 0;
  virtual void inputs_saved(void* /*region*/, InputsSaved /*how*/,
                            const std::vector<at::Tensor>& /*inputs*/) {}
  // The region's forward ended (`error`: what left it, null if nothing).
  virtual void forward_ended(void* /*region*/, const std::exception_ptr& /*error*/) {}
  // Bytes a meter charges while the region's forward runs (MeterCharge): a storage when `tensor`
  // is defined (`bytes` its size), else plain bytes. The token returned is dropped at the refund.
  virtual std::shared_ptr<void> bytes_charged(void* /*region*/, const at::Tensor& /*tensor*/,
                                              int64_t /*bytes*/) {
    return nullptr;
  }
  virtual void rebuild_begun(void* /*region*/) {}
  // The rebuild runs the region's forward again (no replay answered): what it allocates from now
  // on is the rerun's.
  virtual void rebuild_reran(void* /*region*/) {}
  // `reran`: the forward ran again (else a replay answered); `error`: what left it, if anything.
  virtual void rebuild_ended(void* /*region*/, bool /*reran*/, int64_t /*host_ns*/,
                             const std::exception_ptr& /*error*/) {}
  virtual void replayed(void* /*region*/, const ReplayOutcome& /*outcome*/) {}
  // A selective region's save list names that no op of its forward matched.
  virtual void policy_unmatched(void* /*region*/, const std::vector<std::string>& /*names*/) {}
  // A copy of a saved tensor of the region is being prepared (its buffer, then its launch):
  // copy_launched follows on this thread unless the launch throws.
  virtual void copy_begun(void* /*region*/, CopyDirection /*direction*/) {}
  virtual void copy_launched(void* /*region*/, const CopyLaunched& /*copy*/) {}
  virtual void copy_landed(void* /*region*/, const CopyLanded& /*copy*/) {}
  // A reload not landed when backward asked for it; `wait_ns` the host waited (0 unmeasured).
  virtual void reload_late(void* /*region*/, int64_t /*wait_ns*/) {}
  virtual void kept(void* /*region*/, KeptReason /*reason*/, int64_t /*bytes*/) {}
  // A mark the user put on this thread's step (recompose::ledger_mark).
  virtual void mark(const std::string& /*label*/) {}

 private:
  std::atomic<bool> open_{false};
};

// A region as the sinks listening when it began know it. Opaque to producers.
class RegionTag : public std::enable_shared_from_this<RegionTag> {
 public:
  struct Entry {
    std::shared_ptr<Sink> sink;
    std::shared_ptr<void> context;
  };
  // This sink's context of the region, or null.
  void* context_of(const Sink& sink) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  friend std::shared_ptr<RegionTag> region_begun(const RegionBegun& event);
  std::vector<Entry> entries_;
};
using Tag = std::shared_ptr<RegionTag>;

// ---- Emission (call only when listening(); a null tag is a region nobody listens to) ----

// A region begins on this thread: its tag, null when no sink wants it.
Tag region_begun(const RegionBegun& event);

// While alive, `tag`'s forward runs on this thread: the meters' charges, the policy's unmatched
// names and swap's saves go to it. A null tag hides the outer one (a region nobody records).
class ForwardScope {
 public:
  explicit ForwardScope(Tag tag);
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  Tag tag_;
  RegionTag* outer_;
};

// While alive, `tag`'s region is rebuilt on this thread (rebuild_begun, then rebuild_ended with
// its host time): the replay's outcome goes to it. With a null tag it does nothing.
class RebuildScope {
 public:
  explicit RebuildScope(Tag tag);
  ~RebuildScope();  // ends it, if end() did not
  // The forward runs again (no replay answered): rebuild_reran to the sinks.
  void reran();
  // Ends the rebuild now, with what leaves it (from a catch block, before the rethrow).
  void end(const std::exception_ptr& error);
  RebuildScope(const RebuildScope&) = delete;
  RebuildScope& operator=(const RebuildScope&) = delete;

 private:
  Tag tag_;
  RegionTag* outer_;
  bool reran_ = false;
  bool ended_ = false;
  std::chrono::steady_clock::time_point start_;
};

void inputs_saved(const RegionTag& tag, InputsSaved how, const std::vector<at::Tensor>& inputs);
void forward_ended(const RegionTag& tag, const std::exception_ptr& error);
// Charged to the region whose forward runs on this thread: the sinks' tokens (null if none).
std::shared_ptr<void> bytes_charged(const at::Tensor& tensor, int64_t bytes);
// To the region being rebuilt on this thread, if any.
void replayed(const ReplayOutcome& outcome);
// To the region whose forward runs on this thread, if any.
void policy_unmatched(const std::vector<std::string>& names);
void copy_begun(const RegionTag& tag, CopyDirection direction);
void copy_launched(const RegionTag& tag, const CopyLaunched& copy);
void copy_landed(const RegionTag& tag, const CopyLanded& copy);
void reload_late(const RegionTag& tag, int64_t wait_ns);
void kept(const RegionTag& tag, KeptReason reason, int64_t bytes);
// To the sinks listening on this thread.
void mark(const std::string& label);

// The tag of the region whose forward runs on this thread (null if none, or when nothing listens:
// then one relaxed load, so callers need not check listening() first): swap keeps it with the
// tensors saved now.
Tag forward_tag();
// The region being rebuilt on this thread (`in_backward` true), else the one whose forward runs
// here, else null.
const RegionTag* running_here(bool& in_backward);
// Whether a region is being rebuilt on this thread.
bool rebuilding();

}  // namespace recompose::events
