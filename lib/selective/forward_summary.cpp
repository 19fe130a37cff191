// ForwardTrace::summary: the trace's nodes and view calls, merged in the order they ran, as
// SummaryOps (forward_summary.h).
#include "forward_trace.h"

#include "engine/tensor_accounting.h"

#include <algorithm>
#include <unordered_map>

namespace recompose::detail {

int64_t ForwardTrace::output_bytes(const torch::jit::Stack& stack, std::size_t n) {
  return distinct_storage_bytes(c10::ArrayRef<c10::IValue>(stack.data() + (stack.size() - n), n),
                                /*skip_parameter_like=*/false);
}

void ForwardTrace::add_summary_reads(const TensorUse& use, const std::vector<uint32_t>& entry_of,
                                     const std::vector<SummaryOp>& ops,
                                     std::vector<uint32_t>& out) const {
  if (use.storage >= TensorUse::kUnsupported) return;
  const Storage& s = storages_[use.storage];
  if (s.source != Storage::Source::Op) return;
  if (ops[entry_of[s.op]].kind == SummaryOp::Kind::Decided) {
    out.push_back(entry_of[s.op]);
  } else if (ops[entry_of[s.op]].kind == SummaryOp::Kind::AutocastCast) {
    for (const TensorUse& u : uses_of(nodes_[s.op])) add_summary_reads(u, entry_of, ops, out);
  }
}

// Per storage: its creator's kept output, were it the only one kept, would carry every write
// into it (as protect_kept_in decides in the forward, kept_output_unread and carry_write): the
// creator draws no random numbers, each write is carriable, and before each write nothing read
// the value (an op making a value, or autograd saving it) but the writer itself.
std::vector<char> ForwardTrace::storages_carrying_writes() const {
  std::vector<char> carries(storages_.size(), 0);
  std::vector<std::vector<char>> read_at(storages_.size());  // per version, for written storages
  for (uint32_t id = 0; id < storages_.size(); ++id) {
    const Storage& s = storages_[id];
    if (s.source != Storage::Source::Op || s.writers.empty()) continue;
    bool carriable = !nodes_[s.op].traits->random;
    for (uint32_t w : s.writers) carriable = carriable && nodes_[w].traits->carriable;
    carries[id] = carriable ? 1 : 0;
    if (carriable) read_at[id].assign(s.writers.size(), 0);
  }
  auto note_read = [&](const TensorUse& u, std::size_t reader) {
    if (u.storage >= TensorUse::kUnsupported || read_at[u.storage].empty()) return;
    const Storage& s = storages_[u.storage];
    if (u.version < s.writers.size() && s.writers[u.version] != reader)
      read_at[u.storage][u.version] = 1;
  };
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    if (!nodes_[n].makes_values) continue;
    for (const TensorUse& u : uses_of(nodes_[n])) note_read(u, n);
  }
  for (const Saved& s : saved_) note_read(s.use, nodes_.size());
  for (uint32_t id = 0; id < storages_.size(); ++id) {
    for (char r : read_at[id]) carries[id] = carries[id] && !r;
  }
  return carries;
}

// What the writes into an op's output read is the op's to read: a replay that runs the op runs
// those writes too (its readers read the written value); kept, the op answers for both.
void ForwardTrace::add_write_reads(const std::vector<uint32_t>& entry_of,
                                   std::vector<SummaryOp>& ops) const {
  for (uint32_t id = 0; id < storages_.size(); ++id) {
    const Storage& s = storages_[id];
    if (s.source != Storage::Source::Op || s.writers.empty()) continue;
    SummaryOp& creator = ops[entry_of[s.op]];
    if (creator.kind != SummaryOp::Kind::Decided) continue;
    for (uint32_t w : s.writers) {
      for (const TensorUse& u : uses_read(nodes_[w])) {
        if (u.storage != id) add_summary_reads(u, entry_of, ops, creator.reads);
      }
    }
  }
}

// Writes after each op into the storages of its outputs, and whether its kept output would carry
// them: only the creator's can (an alias's entry copies the value before the write).
void ForwardTrace::note_writes_after(const std::vector<uint32_t>& entry_of,
                                     std::vector<SummaryOp>& ops) const {
  const std::vector<char> carrying = storages_carrying_writes();
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    SummaryOp& e = ops[entry_of[n]];
    e.carries_writes = true;
    auto note = [&](uint32_t id, bool created) {
      const Storage& s = storages_[id];
      if (s.writers.empty() || s.writers.back() <= n) return;  // no write after this op
      e.written_after = true;
      e.carries_writes = e.carries_writes && created && carrying[id];
    };
    for (const auto& created : nodes_[n].created) note(created.second, true);
    for (uint32_t id : nodes_[n].aliased) note(id, false);
    e.carries_writes = e.carries_writes && e.written_after;
  }
}

ForwardSummary ForwardTrace::summary() const {
  // Each node's call index among its op's calls; a node in no op's calls is an autocast cast.
  std::vector<int64_t> call_of(nodes_.size(), -1);
  for (const auto& [op, calls] : calls_) {
    for (std::size_t i = 0; i < calls.nodes.size(); ++i) {
      if (calls.nodes[i] != OpCalls::kNoNode) call_of[calls.nodes[i]] = static_cast<int64_t>(i);
    }
  }
  ForwardSummary summary;
  auto& ops = summary.ops;
  std::vector<uint32_t> entry_of(nodes_.size(), 0);
  std::unordered_map<c10::OperatorHandle, int64_t> next_call;  // for the casts
  std::size_t v = 0;
  auto add_views_before = [&](std::size_t position) {
    for (; v < views_.size() && views_[v].position <= position; ++v) {
      SummaryOp& e = ops.emplace_back(views_[v].op, SummaryOp::Kind::View);
      e.call_index = views_[v].call_index;
      e.output_bytes = views_[v].output_bytes;
      next_call[e.op] = e.call_index + 1;
    }
  };
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    add_views_before(n);
    const Node& node = nodes_[n];
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
    e.kept_cast_bytes = node.cast ? node.cast->bytes : 0;
    if (kind == SummaryOp::Kind::Decided) {
      for (const TensorUse& u : uses_read(node)) add_summary_reads(u, entry_of, ops, e.reads);
    }
  }
  add_views_before(nodes_.size());
  add_write_reads(entry_of, ops);
  for (SummaryOp& e : ops) {
    std::sort(e.reads.begin(), e.reads.end());
    e.reads.erase(std::unique(e.reads.begin(), e.reads.end()), e.reads.end());
  }
  note_writes_after(entry_of, ops);
  for (const Saved& s : saved_) {
    if (s.use.storage < storages_.size() && storages_[s.use.storage].source == Storage::Source::Op)
      ops[entry_of[storages_[s.use.storage].op]].saved_for_backward = true;
  }
  summary.replay_fallback =
      for_replay_
          ? plan_replay(/*rng_preserved=*/true, std::vector<bool>(saved_.size(), true)).fallback
          : "selective replay was off in the region's forward "
            "(recompose::set_selective_replay_enabled(false))";
  return summary;
}

}  // namespace recompose::detail
