// The state of one StepLedger and its rows: a sink of the events (events/events.h), shared by the
// recording (step_ledger.cpp), the timeline, the formatting and the out-of-memory explainer.
#pragma once

#include "events/events.h"

#include <recompose/step_ledger.h>

#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace recompose::detail {

struct LedgerState;

// One region invocation: the ledger's context of its events. Held by the ledger, by the region's
// tag (in its frame, in swap's entries) and by the charges it took.
struct LedgerRow : std::enable_shared_from_this<LedgerRow> {
  std::shared_ptr<LedgerState> ledger;
  LedgerRegion region;      // under ledger->mutex
  int64_t live = 0;         // bytes charged to the row now, under ledger->mutex
  int64_t input_bytes = 0;  // of them, its inputs (held as autograd holds them)
  int index = -1;           // in ledger->rows
  // A call of a module with apply_offload: its module, until a region of the same module takes
  // the row over.
  const torch::nn::Module* offload_module = nullptr;
  bool end_sampled = false;  // the forward end sampled (a region and its offloaded call: once)
};

// One point of the memory timeline (step_ledger_timeline.cpp): a LedgerMark and what each row
// held then (rows holding nothing left out), for the largest holders at the peak.
struct LedgerSample {
  LedgerMark mark;
  std::vector<std::pair<int, int64_t>> live;  // (row index, bytes)
  int64_t time_ns = 0;                        // system clock, since the epoch (Kineto's clock)
  // What the rows held then, together.
  int64_t held() const {
    int64_t bytes = 0;
    for (const auto& [row, row_bytes] : live) bytes += row_bytes;
    return bytes;
  }
};

// A copy of a row's saved tensor, from its launch to its landing seen (the Chrome trace's
// slices), and the bytes in flight and on host after each launch and landing (its counters).
struct LedgerCopy {
  int row = -1;
  events::CopyDirection direction = events::CopyDirection::ToHost;
  int64_t bytes = 0;
  int64_t start_ns = 0, end_ns = 0;  // system clock
};
struct LedgerCopyLevel {
  int64_t time_ns = 0;
  int64_t in_flight = 0;  // launched, not seen landed
  int64_t on_host = 0;    // sent to host and not reloaded
};

struct LedgerState : events::Sink {
  std::mutex mutex;
  std::vector<std::shared_ptr<LedgerRow>> rows;  // forward order
  // Storages charged, each to the first row that held it.
  struct Use {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t refs;
    int64_t bytes;
    LedgerRow* row;  // alive: rows holds it until the entries are cleared
  };
  std::unordered_map<const c10::StorageImpl*, Use> storages;
  std::unordered_map<const torch::nn::Module*, std::string> names;  // qualified, in the root
  int64_t unnamed = 0;                                              // checkpoint(fn) regions so far
  c10::Device device{c10::kCPU};      // whose memory the timeline samples
  std::vector<LedgerSample> samples;  // the timeline, in order
  std::vector<LedgerCopy> copies;     // landed, in order
  std::vector<LedgerCopyLevel> copy_levels;
  LedgerCopyLevel copy_level;  // now

  // ---- events::Sink (step_ledger.cpp) ----
  std::shared_ptr<void> region_begun(const events::RegionBegun& event, void* enclosing) override;
  void inputs_saved(void* region, events::InputsSaved how,
                    const std::vector<at::Tensor>& inputs) override;
  void forward_ended(void* region, const std::exception_ptr& error) override;
  std::shared_ptr<void> bytes_charged(void* region, const at::Tensor& tensor,
                                      int64_t bytes) override;
  void rebuild_begun(void* region) override;
  void rebuild_ended(void* region, bool reran, int64_t host_ns,
                     const std::exception_ptr& error) override;
  void replayed(void* region, const events::ReplayOutcome& outcome) override;
  void policy_unmatched(void* region, const std::vector<std::string>& names) override;
  void copy_launched(void* region, const events::CopyLaunched& copy) override;
  void copy_landed(void* region, const events::CopyLanded& copy) override;
  void reload_late(void* region, int64_t wait_ns) override;
  void kept(void* region, events::KeptReason reason, int64_t bytes) override;
  void mark(const std::string& label) override;
};

// Now on the system clock, in ns since the epoch: the clock LibTorch's profiler writes its
// Chrome traces on (baseTimeNanoseconds + ts).
int64_t ledger_now_ns();

// Appends a sample of the ledger's device memory to its timeline: `row` (null for none) gives the
// label, else `label`. Under ledger.mutex; nothing once the ledger is closed.
void ledger_sample(LedgerState& ledger, const char* kind, const LedgerRow* row,
                   const std::string& label = {});

// An error left a row's forward or its rebuild in backward (`in_backward`): a
// c10::OutOfMemoryError gets the ledger's view at that moment appended to its message, once for
// all the regions it passes through (ledger_oom.cpp). Other errors are left as they are.
void ledger_explain_oom(const std::exception_ptr& error, LedgerRow& row, bool in_backward);

}  // namespace recompose::detail

namespace recompose {
struct StepLedger::State : detail::LedgerState {};
}  // namespace recompose
