// What selective checkpointing recorded about the ops of one region invocation: per op overload,
// one slot per call in the forward (kept outputs, or "recompute"), and how far the current
// recomputation has replayed them. Ops are matched by (op overload, call index), as upstream.
#pragma once

#include "cache_entry.h"
#include "generator_effect.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

struct OpCalls;

struct OpSlot {
  enum class Kind : uint8_t { Recompute, Saved, Consumed };
  Kind kind = Kind::Recompute;
  CacheEntry entry;  // Saved only
  // Saved random ops only: what the op did to the generators in the forward, for the replay.
  std::unique_ptr<GeneratorEffect> rng;
  // Recompute slots of in-place ops only: the write into a kept output that its cache entry
  // carries (ForwardTrace::carry_write), in slot `carrier_index` of `carrier`. A recomputation
  // gets the written value from that entry, and does not write it again, unless the carrier was
  // recomputed.
  bool carried_write = false;
  OpCalls* carrier = nullptr;
  size_t carrier_index = 0;
  // Saved slots only: the entry carried writes and was modified in place after the forward (the
  // program wrote into the region's output, which the kept output is): a recomputation that runs
  // the forward again runs the op again, and the writes it carried, as with a copy of its own.
  bool carrier_recomputed = false;
};

struct OpCalls {
  std::vector<OpSlot> slots;  // one per forward call, in order
  size_t replayed = 0;        // calls seen by the current recomputation
};

class OpLog {
 public:
  // The calls of `op` (created empty on first use). References stay valid as ops are added.
  OpCalls& calls_of(const c10::OperatorHandle& op) { return ops_[op]; }
  // nullptr if the forward never ran `op`.
  OpCalls* find(const c10::OperatorHandle& op) {
    auto it = ops_.find(op);
    return it == ops_.end() ? nullptr : &it->second;
  }
  // A new recomputation matches calls from the first one again.
  void restart_replay() {
    for (auto& [op, calls] : ops_) calls.replayed = 0;
  }
  // Drops every kept output (after a selective replay, which uses them once).
  void release_kept() {
    for (auto& [op, calls] : ops_) {
      for (OpSlot& slot : calls.slots) {
        if (slot.kind != OpSlot::Kind::Saved) continue;
        slot.entry.release();
        slot.kind = OpSlot::Kind::Consumed;
      }
    }
  }

 private:
  std::unordered_map<c10::OperatorHandle, OpCalls> ops_;
};

}  // namespace recompose::detail
