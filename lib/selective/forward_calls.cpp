// The trace as a forward run again reads it: per op, the forward's calls and their nodes, the kept
// outputs they own and the writes those carried (kept_output.h). One record of the forward: the
// replay and a forward run again answer from the same nodes.
#include "forward_trace.h"

namespace recompose::detail {

OpCalls* ForwardTrace::find_calls(const c10::OperatorHandle& op) {
  auto it = calls_.find(op);
  return it == calls_.end() ? nullptr : &it->second;
}

const KeptOutput* ForwardTrace::carrier_of(uint32_t node) const {
  const uint32_t carrier = nodes_[node].carrier;
  return carrier == OpCalls::kNoNode ? nullptr : nodes_[carrier].kept.get();
}

void ForwardTrace::restart_calls() {
  for (auto& [op, calls] : calls_) calls.rerun_seen = 0;
}

void ForwardTrace::release_kept() {
  for (TraceNode& node : nodes_) {
    if (node.kept && node.kept->available()) node.kept->consume();
  }
}

}  // namespace recompose::detail
