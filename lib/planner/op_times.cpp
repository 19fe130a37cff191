#include "op_times.h"

#include <algorithm>

namespace recompose::detail {

// Note [ Op times scaled to the plain forward ]
// Run 2 times each op between two calls of its keep-all policy, so each op's time carries the
// profiler's recording (every output kept, the region's trace summarised): on the CPU GPT of
// 2026-11-29 a block's ops summed to 17.85 ms, its intercepted forward to 18.02 ms and its plain
// forward (run 3) to 13.48 ms. A selective step pays none of that recording, but the solver priced
// both its recomputation (the dropped ops' times) and its fixed cost (intercepted forward - plain
// forward) with it: transformer_policy was estimated at 1.42x of none where it trained at 1.11x.
// So the spans are scaled to sum to the plain forward, and the intercepted forward keeps only
// what lies outside them (the region's set-up and end), above the plain forward. Either way the
// intercepted forward is never below the plain one: it runs the same ops and more, and a plain run
// that a busy machine slowed must not make interception look like a gain (the pricing reads the
// difference as the fixed cost of a selective module).

// Note [ A kept draw is no op's recomputation ]
// An op's span also holds the ops no policy sees that ran since the op before: on CPU dropout is
// empty_like, bernoulli_ (in place: no policy call), div_, mul, so the draw lands in mul's span.
// The draw is most of a dropout on CPU, and a replay does not run it: it writes the kept bits back
// (DrawMask). In a Kineto profile of the default GPT a forward dropout took 1.4-1.5 ms, the
// replay's div_ and mul 33 and 113 us
// (docs/benchmarks/2026-11-29-cpu-2core-gpt-kineto-dropout.txt). Charged to mul, the draws made the
// dropouts the dearest ops of a block to drop: at 70f268b transformer_policy, which drops them, was
// estimated 8-19% above its trials' steps in the default GPT's sweeps, and the solver kept the
// dropouts' outputs and dropped matmuls, priced below their cost by the scaling below
// (docs/benchmarks/2026-11-29-cpu-2core-planner-sweep-draws-{default,8x256}.txt). The forward
// interceptor times each kept draw on the host clock when a summary is recorded
// (SummaryOp::draw_seconds); the profiler notes it beside the span of the op that follows, and it
// is taken out of that op's time here. It still counts in the sum scaled to the plain forward
// (the spans held it), and it stays in where the module does not replay: a forward run again
// draws again. A device profile times spans with events, not the host clock: nothing is taken
// out there (and dropout is one op there, native_dropout, which the replay rebuilds from its mask).
void settle_op_times(ModuleProfile& m, const std::vector<double>& draws) {
  double spans = 0;
  for (size_t k = 0; k < m.ops.size(); ++k) {
    const double span = std::max(0.0, m.ops[k].seconds);
    spans += span;
    if (m.replayed && k < draws.size()) m.ops[k].seconds = span - std::clamp(draws[k], 0.0, span);
  }
  if (m.forward_seconds > 0 && spans > m.forward_seconds) {
    const double scale = m.forward_seconds / spans;
    for (auto& op : m.ops) op.seconds *= scale;
    m.selective_forward_seconds =
        m.forward_seconds + std::max(0.0, m.selective_forward_seconds - spans);
  }
  m.selective_forward_seconds = std::max(m.selective_forward_seconds, m.forward_seconds);
}

void add_draws_in_spans(const ForwardSummary& summary, const std::vector<int64_t>& index_of,
                        std::vector<double>& draws) {
  // record() times from one policy call to the next: what ran since the Decided op before is in
  // this one's span.
  double pending = 0;
  for (size_t e = 0; e < summary.ops.size(); ++e) {
    const SummaryOp& op = summary.ops[e];
    pending += op.draw_seconds;
    if (op.kind != SummaryOp::Kind::Decided) continue;
    if (e < index_of.size() && index_of[e] >= 0) {
      const auto k = static_cast<size_t>(index_of[e]);
      if (draws.size() <= k) draws.resize(k + 1, 0.0);
      draws[k] += pending;
    }
    pending = 0;
  }
}

}  // namespace recompose::detail
