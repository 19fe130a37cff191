// The state of one StepLedger and its rows, shared by the recording (step_ledger.cpp) and the
// formatting (step_ledger_format.cpp).
#pragma once

#include "engine/step_ledger.h"

#include <recompose/step_ledger.h>

#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace recompose::detail {

// One region invocation. Held by the ledger, by its frame (backward fills it in) and by the
// charges it took.
struct LedgerRow : std::enable_shared_from_this<LedgerRow> {
  std::shared_ptr<LedgerState> ledger;
  LedgerRegion region;      // under ledger->mutex
  int64_t live = 0;         // bytes charged to the row now, under ledger->mutex
  int64_t input_bytes = 0;  // of them, its inputs (held as autograd holds them)
  int index = -1;           // in ledger->rows
  // A call of a module with apply_offload (ledger_begin_offload): its module, until a region of
  // the same module takes the row over.
  const torch::nn::Module* offload_module = nullptr;
};

// One point of the memory timeline (step_ledger_timeline.cpp): a LedgerMark and what each row
// held then (rows holding nothing left out), for the largest holders at the peak.
struct LedgerSample {
  LedgerMark mark;
  std::vector<std::pair<int, int64_t>> live;  // (row index, bytes)
};

struct LedgerState {
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
  std::atomic<bool> open{true};
  c10::Device device{c10::kCPU};      // whose memory the timeline samples
  std::vector<LedgerSample> samples;  // the timeline, in order
};

// Appends a sample of the ledger's device memory to its timeline: `row` (null for none) gives the
// label, else `label`. Under ledger.mutex; nothing once the ledger is destroyed.
void ledger_sample(LedgerState& ledger, const char* kind, const LedgerRow* row,
                   const std::string& label = {});

}  // namespace recompose::detail

namespace recompose {
struct StepLedger::State : detail::LedgerState {};
}  // namespace recompose
