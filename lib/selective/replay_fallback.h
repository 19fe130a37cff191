// Fallback: why a selective region cannot be replayed, so that its recomputation runs the region's
// forward again (the rerun). The replay's plan and checks answer std::optional<Fallback>: no value
// when nothing stops the replay, a Fallback with its reason otherwise (Note [ The replay's
// contract ], replay_plan.cpp). Its reason reaches users as SelectiveReplayStats'
// last_fallback_reason, the ledger's fallback_reason and inspect_policy's report.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace recompose::detail {

struct Fallback {
  explicit Fallback(std::string why) : reason(std::move(why)) {}
  std::string reason;  // never empty: says what the replay could not rebuild, and why
};

using MaybeFallback = std::optional<Fallback>;

// The reason of `fallback`, or "" when there is none (the text users read).
inline std::string reason_of(const MaybeFallback& fallback) {
  return fallback ? fallback->reason : std::string();
}

}  // namespace recompose::detail
