// The policy warnings of selective regions (policy_warnings.h).
#include "policy_warnings.h"

#include "engine/format_bytes.h"
#include "sac_state.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_set>

namespace recompose::detail {
namespace {

// Two policies are likely mistakes: one that keeps nothing recomputes the whole region and
// intercepts every op (transformer_policy() on a CNN; measured against full checkpointing, the
// replay can still win: on the CPU GPT it wrote dropout's draws back and ran no module code), one
// that keeps more bytes than autograd saves
// holds more than no checkpointing (keeping the addmm outputs of a Linear + ReLU stack). Each is
// said once per kind of region (same op names in the same order: twin blocks warn once), for the
// first few kinds of a process, so that a randomized test does not flood its log.
struct PolicyWarnings {
  std::mutex mutex;
  std::unordered_set<size_t> warned;  // op signatures, salted by warning
};
PolicyWarnings& policy_warnings() {
  static PolicyWarnings w;
  return w;
}
thread_local bool policy_warnings_off = false;  // PolicyWarningsOff

bool first_warning_of(size_t signature) {
  constexpr size_t kMostWarnings = 8;
  auto& w = policy_warnings();
  std::lock_guard lock(w.mutex);
  return w.warned.size() < kMostWarnings && w.warned.insert(signature).second;
}

}  // namespace

// At the end of a region's forward, when every decision was made and every tensor saved.
void warn_about_policy(const SacState& s) {
  if (s.tally.decisions == 0 || policy_warnings_off || s.keeps_nothing_inside_full) return;
  if (s.tally.first_kept_op.empty()) {
    if (!first_warning_of(s.tally.op_signature)) return;
    TORCH_WARN(
        "recompose: selective checkpoint: the policy kept no output of the ", s.tally.decisions,
        " ops it was asked about in a region's forward (the first: ", s.tally.first_decided_op,
        "), so the region is fully recomputed, and its forward pays for interception. If the "
        "policy was meant to keep some, name ops it runs (recompose::inspect_policy(policy, "
        "module, input) lists them); if not, compare the step with full checkpointing, which "
        "intercepts nothing (the replay that serves this region can still be the cheaper "
        "recomputation: it runs no module code and builds no autograd graph).");
    return;
  }
  const int64_t plain = s.trace.saved_bytes_from_ops();
  if (s.tally.kept_device_bytes <= plain) return;
  if (!first_warning_of(s.tally.op_signature ^ 0x9e3779b97f4a7c15ull)) return;
  TORCH_WARN(
      "recompose: selective checkpoint: the policy keeps ", format_bytes(s.tally.kept_device_bytes),
      " of op outputs in a region's forward (the first kept: ", s.tally.first_kept_op,
      "), more than no checkpointing would hold there (", format_bytes(plain),
      " saved by autograd): checkpointing this region costs memory. Keep fewer ops, ones whose "
      "outputs backward reads (recompose::inspect_policy(policy, module, input) shows what each op "
      "keeps), or do not checkpoint the region.");
}

PolicyWarningsOff::PolicyWarningsOff() : was_off_(policy_warnings_off) {
  policy_warnings_off = true;
}
PolicyWarningsOff::~PolicyWarningsOff() { policy_warnings_off = was_off_; }

void reset_policy_warnings() {
  auto& w = policy_warnings();
  std::lock_guard lock(w.mutex);
  w.warned.clear();
}

}  // namespace recompose::detail
