// What a selective region's forward kept of one op (its node in the ForwardTrace owns it), and
// the per-op call list by which a recomputation that runs the forward again finds each call's
// node: upstream's `func -> idx -> saved | recompute | consumed`, matched by (op overload, call
// index) as upstream does, so that a forward run again may interleave different ops otherwise.
#pragma once

#include "cache_entry.h"
#include "generator_effect.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

struct KeptOutput {
  CacheEntry entry;
  // Random ops: what the op did to the generators in the forward, for a forward run again.
  std::unique_ptr<GeneratorEffect> rng;
  int64_t call_index = 0;  // which call of its op (errors name it)
  // Handed out (by the replay, or by a forward run again): a second use is a second backward.
  bool consumed = false;
  // The entry carried writes and was modified in place after the forward (the program wrote into
  // the region's output, which the kept output is): a forward run again runs the op again, and
  // the writes it carried, as with a copy of its own.
  bool carrier_recomputed = false;

  bool available() const { return !consumed; }
  // Marks it handed out and frees its memory (one recomputation per region).
  void consume() {
    consumed = true;
    entry.release();
  }
};

// The forward's calls of one op, in order: each call's trace node, or kNoNode for a call the
// trace does not record (a view). `rerun_seen`: calls seen by the current forward run again.
struct OpCalls {
  static constexpr uint32_t kNoNode = UINT32_MAX;
  std::vector<uint32_t> nodes;
  std::size_t rerun_seen = 0;
};

}  // namespace recompose::detail
