// summarize: the trace's nodes and view calls, merged in the order they ran, as SummaryOps
// (forward_summary.h).
#include "forward_summary.h"

#include "forward_trace.h"
#include "replay_plan.h"

#include <algorithm>
#include <unordered_map>

namespace recompose::detail {

namespace {

// The Decided ops whose storages `use` reads (through an autocast cast, what it cast).
void add_summary_reads(const ForwardTrace& t, const TensorUse& use,
                       const std::vector<uint32_t>& entry_of, const std::vector<SummaryOp>& ops,
                       std::vector<uint32_t>& out) {
  if (use.storage >= TensorUse::kUnsupported) return;
  const TraceStorage& s = t.storages()[use.storage];
  if (s.source != TraceStorage::Source::Op) return;
  if (ops[entry_of[s.op]].kind == SummaryOp::Kind::Decided) {
    out.push_back(entry_of[s.op]);
  } else if (ops[entry_of[s.op]].kind == SummaryOp::Kind::AutocastCast) {
    for (const TensorUse& u : t.uses_of(t.nodes()[s.op]))
      add_summary_reads(t, u, entry_of, ops, out);
  }
}

// Per storage: its creator's kept output, were it the only one kept, would carry every write
// into it (as protect_kept_in decides in the forward, kept_output_unread and carry_write): the
// creator draws no random numbers, each write is carriable, and before each write nothing read
// the value (an op making a value, or autograd saving it) but the writer itself.
std::vector<char> storages_carrying_writes(const ForwardTrace& t) {
  const std::vector<TraceStorage>& storages = t.storages();
  const std::vector<TraceNode>& nodes = t.nodes();
  std::vector<char> carries(storages.size(), 0);
  std::vector<std::vector<char>> read_at(storages.size());  // per version, for written storages
  for (uint32_t id = 0; id < storages.size(); ++id) {
    const TraceStorage& s = storages[id];
    if (s.source != TraceStorage::Source::Op || s.writers.empty()) continue;
    bool carriable = !nodes[s.op].traits->random;
    for (uint32_t w : s.writers) carriable = carriable && nodes[w].traits->carriable;
    carries[id] = carriable ? 1 : 0;
    if (carriable) read_at[id].assign(s.writers.size(), 0);
  }
  auto note_read = [&](const TensorUse& u, std::size_t reader) {
    if (u.storage >= TensorUse::kUnsupported || read_at[u.storage].empty()) return;
    const TraceStorage& s = storages[u.storage];
    if (u.version < s.writers.size() && s.writers[u.version] != reader)
      read_at[u.storage][u.version] = 1;
  };
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (!nodes[n].makes_values) continue;
    for (const TensorUse& u : t.uses_of(nodes[n])) note_read(u, n);
  }
  for (const TraceSaved& s : t.saved_tensors()) note_read(s.use, nodes.size());
  for (uint32_t id = 0; id < storages.size(); ++id) {
    for (char r : read_at[id]) carries[id] = carries[id] && !r;
  }
  return carries;
}

// What the writes into an op's output read is the op's to read: a replay that runs the op runs
// those writes too (its readers read the written value); kept, the op answers for both.
void add_write_reads(const ForwardTrace& t, const std::vector<uint32_t>& entry_of,
                     std::vector<SummaryOp>& ops) {
  const std::vector<TraceStorage>& storages = t.storages();
  for (uint32_t id = 0; id < storages.size(); ++id) {
    const TraceStorage& s = storages[id];
    if (s.source != TraceStorage::Source::Op || s.writers.empty()) continue;
    SummaryOp& creator = ops[entry_of[s.op]];
    if (creator.kind != SummaryOp::Kind::Decided) continue;
    for (uint32_t w : s.writers) {
      for (const TensorUse& u : t.uses_read(t.nodes()[w])) {
        if (u.storage != id) add_summary_reads(t, u, entry_of, ops, creator.reads);
      }
    }
  }
}

// Writes after each op into the storages of its outputs, and whether its kept output would carry
// them: only the creator's can (an alias's entry copies the value before the write).
void note_writes_after(const ForwardTrace& t, const std::vector<uint32_t>& entry_of,
                       std::vector<SummaryOp>& ops) {
  const std::vector<TraceStorage>& storages = t.storages();
  const std::vector<TraceNode>& nodes = t.nodes();
  const std::vector<char> carrying = storages_carrying_writes(t);
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    SummaryOp& e = ops[entry_of[n]];
    e.carries_writes = true;
    auto note = [&](uint32_t id, bool created) {
      const TraceStorage& s = storages[id];
      if (s.writers.empty() || s.writers.back() <= n) return;  // no write after this op
      e.written_after = true;
      e.carries_writes = e.carries_writes && created && carrying[id];
    };
    for (const auto& created : nodes[n].created) note(created.second, true);
    for (uint32_t id : nodes[n].aliased) note(id, false);
    e.carries_writes = e.carries_writes && e.written_after;
  }
}

}  // namespace

ForwardSummary summarize(const ForwardTrace& t) {
  const std::vector<TraceNode>& nodes = t.nodes();
  const std::vector<TraceViewCall>& views = t.view_calls();
  // Each node's call index among its op's calls; a node in no op's calls is an autocast cast.
  std::vector<int64_t> call_of(nodes.size(), -1);
  for (const auto& [op, calls] : t.calls()) {
    for (std::size_t i = 0; i < calls.nodes.size(); ++i) {
      if (calls.nodes[i] != OpCalls::kNoNode) call_of[calls.nodes[i]] = static_cast<int64_t>(i);
    }
  }
  ForwardSummary summary;
  auto& ops = summary.ops;
  std::vector<uint32_t> entry_of(nodes.size(), 0);
  std::unordered_map<c10::OperatorHandle, int64_t> next_call;  // for the casts
  std::size_t v = 0;
  auto add_views_before = [&](std::size_t position) {
    for (; v < views.size() && views[v].position <= position; ++v) {
      SummaryOp& e = ops.emplace_back(views[v].op, SummaryOp::Kind::View);
      e.call_index = views[v].call_index;
      e.output_bytes = views[v].output_bytes;
      next_call[e.op] = e.call_index + 1;
    }
  };
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    add_views_before(n);
    const TraceNode& node = nodes[n];
    const SummaryOp::Kind kind = call_of[n] < 0               ? SummaryOp::Kind::AutocastCast
                                 : node.traits->returns_alias ? SummaryOp::Kind::Write
                                                              : SummaryOp::Kind::Decided;
    entry_of[n] = static_cast<uint32_t>(ops.size());
    SummaryOp& e = ops.emplace_back(node.op, kind);
    if (kind == SummaryOp::Kind::AutocastCast) {
      e.call_index = next_call[node.op];
    } else {
      e.call_index = call_of[n];
      next_call[node.op] = e.call_index + 1;
    }
    e.output_bytes = node.output_bytes;
    e.draw_bytes =
        (node.draw ? node.draw->bytes() : 0) + (node.dropout ? node.dropout->bytes() : 0);
    e.draw_seconds = node.draw_seconds;
    e.kept_cast_bytes = node.cast ? node.cast->bytes : 0;
    if (kind == SummaryOp::Kind::Decided) {
      for (const TensorUse& u : t.uses_read(node)) add_summary_reads(t, u, entry_of, ops, e.reads);
    }
  }
  add_views_before(nodes.size());
  add_write_reads(t, entry_of, ops);
  for (SummaryOp& e : ops) {
    std::sort(e.reads.begin(), e.reads.end());
    e.reads.erase(std::unique(e.reads.begin(), e.reads.end()), e.reads.end());
  }
  note_writes_after(t, entry_of, ops);
  const std::vector<TraceStorage>& storages = t.storages();
  for (const TraceSaved& s : t.saved_tensors()) {
    if (s.use.storage < storages.size() &&
        storages[s.use.storage].source == TraceStorage::Source::Op)
      ops[entry_of[storages[s.use.storage].op]].saved_for_backward = true;
  }
  summary.replay_fallback =
      t.recorded_for_replay()
          ? reason_of(plan_replay(t, /*rng_preserved=*/true,
                                  std::vector<bool>(t.saved_tensors().size(), true))
                          .fallback)
          : "selective replay was off in the region's forward "
            "(recompose::set_selective_replay_enabled(false))";
  return summary;
}

}  // namespace recompose::detail
