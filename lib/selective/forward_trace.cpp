#include "forward_trace.h"

#include "batch_norm_replay.h"
#include "engine/tensor_accounting.h"
#include "replay_plan.h"
#include "replay_substitute.h"
#include "trace_tensors.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace recompose::detail {
namespace {

// A value the replay can pass as a constant: holds no tensor.
bool holds_tensor(const c10::IValue& v) {
  if (v.isTensor() || v.isTensorList() || v.isOptionalTensorList()) return true;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (holds_tensor(e)) return true;
    }
    return false;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (holds_tensor(e)) return true;
    }
    return false;
  }
  return v.isGenericDict() || v.isObject() || v.isFuture() || v.isCapsule();
}

// Note [ A trace reserves the last one's sizes ]
// A trace's arrays grow as the forward runs, and a vector that grows moves every element it holds
// (a node or a use moves its SmallVectors element by element; the storage index rehashes). Regions
// repeat from step to step, so a trace reserves, at its first op, the sizes the last trace
// destroyed in this process reached: in regions of 200 ops this, with add_storage's weak reference
// taken without a strong one, cut the interception's instructions per op by 30%
// (docs/benchmarks/2026-11-29-cpu-2core-interception-reserve.txt). A guess, never a limit: the
// arrays still grow past it, and it is capped so that one huge region cannot make every later
// small one reserve as much. Relaxed atomics: any recent trace's sizes will do.
struct TraceSizes {
  static constexpr std::size_t kCap = std::size_t{1} << 14;
  std::atomic<std::size_t> nodes{0}, args{0}, uses{0}, storages{0};
};
TraceSizes& last_trace_sizes() {
  static TraceSizes sizes;
  return sizes;
}
std::size_t capped(std::size_t n) { return std::min(n, TraceSizes::kCap); }

}  // namespace

ForwardTrace::~ForwardTrace() {
  if (nodes_.empty()) return;  // a region that ran no op is no guide
  TraceSizes& last = last_trace_sizes();
  last.nodes.store(capped(nodes_.size()), std::memory_order_relaxed);
  last.args.store(capped(args_.size()), std::memory_order_relaxed);
  last.uses.store(capped(uses_.size()), std::memory_order_relaxed);
  last.storages.store(capped(storages_.size()), std::memory_order_relaxed);
}

void ForwardTrace::reserve_like_last() {
  const TraceSizes& last = last_trace_sizes();
  nodes_.reserve(last.nodes.load(std::memory_order_relaxed));
  args_.reserve(last.args.load(std::memory_order_relaxed));
  uses_.reserve(last.uses.load(std::memory_order_relaxed));
  const std::size_t storages = last.storages.load(std::memory_order_relaxed);
  if (storages > storages_.size()) {  // the inputs may be registered already
    storages_.reserve(storages);
    index_.reserve(storages);
  }
}

void ForwardTrace::for_each_kept(
    const std::function<void(const c10::OperatorHandle&, KeptOutput&)>& f) const {
  for (const TraceNode& node : nodes_) {
    if (node.kept) f(node.op, *node.kept);
  }
}

int64_t ForwardTrace::output_bytes(const torch::jit::Stack& stack, std::size_t n) {
  return distinct_storage_bytes(c10::ArrayRef<c10::IValue>(stack.data() + (stack.size() - n), n),
                                /*skip_parameter_like=*/false);
}

c10::ArrayRef<TensorUse> ForwardTrace::uses_read(const TraceNode& node) const {
  // A kept draw reads only the tensor it is written into.
  if (node.draw) return uses_of(node).slice(args_of(node)[0].first, args_of(node)[0].count);
  return uses_of(node);
}

uint32_t ForwardTrace::add_storage(const at::Tensor& t, TraceStorage::Source source) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const auto id = static_cast<uint32_t>(storages_.size());
  TraceStorage& s = storages_.emplace_back();  // filled in place: no TraceStorage moved
  s.source = source;
  s.key = impl;
  s.weak = t.storage().getWeakStorageImpl();
  s.base.set(t);
  index_.emplace(impl, id);
  return id;
}

uint32_t ForwardTrace::storage_of(const at::Tensor& t) {
  auto it = index_.find(t.storage().unsafeGetStorageImpl());
  if (it != index_.end()) return it->second;
  // First sight of a tensor from outside the region (a parameter, a captured tensor): kept.
  const uint32_t id = add_storage(t, TraceStorage::Source::Outside);
  storages_[id].outside = alias_of(t);
  storages_[id].outside_version = version_or_zero(t);
  return id;
}

TensorUse ForwardTrace::use_of(const at::Tensor& t) {
  TensorUse u;
  fill_use(t, u);
  return u;
}

void ForwardTrace::fill_use(const at::Tensor& t, TensorUse& u) {
  if (!t.defined()) return;
  if (!t.has_storage() || t.layout() != at::kStrided || t.is_conj() || t.is_neg() ||
      t.is_nested()) {
    u.storage = TensorUse::kUnsupported;
    return;
  }
  u.storage = storage_of(t);
  u.version = static_cast<uint32_t>(storages_[u.storage].writers.size());
  u.geometry.set(t);
}

void ForwardTrace::add_inputs(const std::vector<at::Tensor>& inputs) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided || t.is_conj() || t.is_neg())
      continue;
    if (index_.find(t.storage().unsafeGetStorageImpl()) != index_.end())
      continue;  // a view of an earlier input
    storages_[add_storage(t, TraceStorage::Source::Input)].input = static_cast<uint32_t>(i);
  }
}

void ForwardTrace::begin(const c10::OperatorHandle& op, const OpTraits& traits,
                         const torch::jit::Stack& stack) {
  if (pending_) poisoned_ = true;  // the previous op threw
  pending_ = true;
  if (nodes_.capacity() == 0) reserve_like_last();
  TraceNode& node = nodes_.emplace_back(op, traits);
  const bool hidden_writes = traits.writes_undeclared;
  node.hidden_writes = hidden_writes;
  const auto& arguments = op.schema().arguments();
  const std::size_t base = stack.size() - arguments.size();
  // See Note [ Batch norm replayed with stand-in running statistics ] (batch_norm_replay.h).
  const std::optional<bool> batch_norm_training =
      hidden_writes ? native_batch_norm_training(op, stack) : std::nullopt;
  if (batch_norm_training) node.hidden_writes = false;
  const bool stand_in_running_stats = batch_norm_training.value_or(false);
  node.first_arg = static_cast<uint32_t>(args_.size());
  node.arg_count = static_cast<uint32_t>(arguments.size());
  node.first_use = static_cast<uint32_t>(uses_.size());
  args_.resize(args_.size() + arguments.size());
  auto uses_so_far = [&] { return static_cast<uint32_t>(uses_.size()) - node.first_use; };
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& v = stack[base + i];
    TraceArg& arg = args_[node.first_arg + i];
    arg.first = uses_so_far();
    if (stand_in_running_stats && (i == kBatchNormRunningMean || i == kBatchNormRunningVar)) {
      if (v.isTensor() && v.toTensor().defined()) {
        arg.kind = TraceArg::Kind::StandIn;
        arg.stand_in = std::make_unique<RunningStatStandIn>(RunningStatStandIn::of(v.toTensor()));
      }  // else None, a constant
      continue;
    }
    if (v.isTensor()) {
      arg.kind = TraceArg::Kind::Tensor;
      add_use(v.toTensor());
    } else if (v.isTensorList()) {
      arg.kind = TraceArg::Kind::TensorList;
      for (const at::Tensor& t : v.toTensorList()) add_use(t);
    } else if (v.isOptionalTensorList()) {
      arg.kind = TraceArg::Kind::OptionalTensorList;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        TensorUse& u = uses_.emplace_back();
        if (t.has_value()) fill_use(*t, u);
      }
    } else {
      if (!v.isScalar() && !v.isNone() && holds_tensor(v)) node.unsupported = true;
      arg.constant = v;
    }
    arg.count = uses_so_far() - arg.first;
    if (traits.writes(i)) {
      for (uint32_t u = arg.first; u < arg.first + arg.count; ++u) {
        const uint32_t s = uses_[node.first_use + u].storage;
        if (s == TensorUse::kUnsupported) node.unsupported = true;
        if (s >= TensorUse::kUnsupported) continue;
        bool seen = false;
        for (uint32_t w : node.writes) seen = seen || w == s;
        if (!seen) node.writes.push_back(s);
      }
    }
  }
  node.use_count = uses_so_far();
}

void ForwardTrace::end(const torch::jit::Stack& stack, std::unique_ptr<KeptOutput> kept,
                       std::unique_ptr<GeneratorEffect> rng, std::unique_ptr<DrawMask> draw) {
  pending_ = false;
  TraceNode& node = nodes_.back();
  const auto n = static_cast<uint32_t>(nodes_.size() - 1);
  if (summarizing_) node.output_bytes = output_bytes(stack, node.op.schema().returns().size());
  for_each_output(stack, node.op.schema().returns().size(), [&](uint32_t k, const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided) return;
    if (auto known = index_.find(t.storage().unsafeGetStorageImpl()); known != index_.end()) {
      if (summarizing_ &&
          std::find(node.aliased.begin(), node.aliased.end(), known->second) == node.aliased.end())
        node.aliased.push_back(known->second);
      return;  // a view of, or an alias to, a known storage
    }
    const uint32_t id = add_storage(t, TraceStorage::Source::Op);
    storages_[id].op = n;
    storages_[id].output = k;
    node.created.emplace_back(k, id);
  });
  for (uint32_t s : node.writes) storages_[s].writers.push_back(n);
  // Autograd saved this op's inputs before it ran (their position is n); one it wrote into is
  // read by backward as written. See Note [ Early stop after the op's own writes ].
  auto first_of_op = saved_.end();
  while (!node.writes.empty() && first_of_op != saved_.begin() &&
         std::prev(first_of_op)->position == n) {
    --first_of_op;
  }
  bool moved = false;
  for (auto it = first_of_op; it != saved_.end(); ++it) {
    for (uint32_t w : node.writes) {
      if (it->use.storage != w) continue;
      it->use.version = static_cast<uint32_t>(storages_[w].writers.size());
      it->position = n + 1;
      moved = true;
    }
  }
  if (moved) {  // the replay hands saved tensors out in position order
    std::stable_sort(first_of_op, saved_.end(), [](const TraceSaved& a, const TraceSaved& b) {
      return a.position < b.position;
    });
  }
  // The versions this op read are needed again if it runs again (in a replay, or in a forward run
  // again). An op that returns only tensors on storages known before (_unsafe_view) makes no
  // value of its own: its reads do not count (item's, equal's do).
  bool makes_values = !node.created.empty() || !node.writes.empty();
  for (std::size_t i = stack.size() - node.op.schema().returns().size(); i < stack.size(); ++i) {
    makes_values = makes_values || !(stack[i].isTensor() || stack[i].isTensorList());
  }
  node.makes_values = makes_values;
  if (makes_values) {
    for (const TensorUse& u : uses_of(node)) {
      if (u.storage < TensorUse::kUnsupported) storages_[u.storage].read = true;
    }
  }
  node.kept = std::move(kept);
  if (!node.kept && for_replay_ && node.traits->cheaper_replay && !node.unsupported) {
    c10::SmallVector<c10::IValue, 4> constants;
    for (const TraceArg& arg : args_of(node)) constants.push_back(arg.constant);
    const std::size_t n_out = node.op.schema().returns().size();
    if (n_out > 0 && n_out <= stack.size() && stack[stack.size() - n_out].isTensor()) {
      node.replay_as =
          cheaper_replay_op(node.op, constants, stack[stack.size() - n_out].toTensor());
    }
  }
  if (for_replay_) node.rng = std::move(rng);
  if (for_replay_ && draw && node.arg_count > 0 &&
      args_of(node)[0].kind == TraceArg::Kind::Tensor && args_of(node)[0].count == 1) {
    node.draw = std::move(draw);  // written into the first argument, as bernoulli_ draws into self
  }
  node.complete = true;
}

bool ForwardTrace::kept_output_unread(const at::Tensor& written, uint32_t node) const {
  if (poisoned_ || pending_ || !written.has_storage()) return false;
  auto it = index_.find(written.storage().unsafeGetStorageImpl());
  if (it == index_.end()) return false;
  const TraceStorage& s = storages_[it->second];
  return s.source == TraceStorage::Source::Op && s.op == node && nodes_[s.op].kept && !s.read;
}

void ForwardTrace::carry_write(const at::Tensor& written) {
  TraceStorage& s = storages_[index_.at(written.storage().unsafeGetStorageImpl())];  // known
  s.kept_version = static_cast<uint32_t>(s.writers.size());
  ++writes_carried_;
  s.read = false;  // the writer's own read of the value before is behind the kept value now
}

void ForwardTrace::release_draws() {
  for (TraceNode& node : nodes_) {
    node.draw.reset();
    node.dropout.reset();
    node.cast.reset();
  }
}

void ForwardTrace::keep_cast(const torch::jit::Stack& stack) {
  TraceNode& node = nodes_.back();
  if (!for_replay_ || !node.complete || stack.empty() || !stack.back().isTensor()) return;
  const at::Tensor& cast = stack.back().toTensor();
  if (cast.defined() && cast.has_storage() && node.created.size() == 1)
    node.cast = std::make_unique<KeptCast>(cast);
}

void ForwardTrace::keep_dropout_draw(std::unique_ptr<DropoutDraw> draw) {
  TraceNode& node = nodes_.back();
  // Both outputs made storages of their own (the output and the mask): the replay makes both.
  if (for_replay_ && node.complete && node.created.size() == 2 && node.arg_count > 0 &&
      args_of(node)[0].kind == TraceArg::Kind::Tensor && args_of(node)[0].count == 1)
    node.dropout = std::move(draw);
}

void ForwardTrace::release_masks_read_through() {
  bool any = false;
  for (const TraceNode& node : nodes_) any = any || (node.dropout && node.dropout->on_device());
  if (!any) return;
  // The replay of every saved tensor (what backward asks for): where it reads a dropout's output,
  // the kept mask saves about nothing on the device (Note [ Dropout's draw kept on every device ]).
  const ReplayPlan plan =
      plan_replay(*this, /*rng_preserved=*/true, std::vector<bool>(saved_.size(), true));
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    TraceNode& node = nodes_[n];
    if (!node.dropout || !node.dropout->on_device()) continue;
    const bool mask_alone =
        plan.replayable() && plan.run[n] && plan.last_use[node.created[0].second] < 0;
    if (mask_alone) {
      node.dropout->hold();
    } else {
      node.dropout.reset();
    }
  }
}

KeptForReplay ForwardTrace::settle_kept_for_replay(double budget) {
  release_masks_read_through();
  KeptForReplay kept;
  std::vector<uint32_t> offered;
  std::vector<int64_t> bytes;
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    TraceNode& node = nodes_[n];
    if (node.draw) kept.draws.push_back(node.draw->bytes());
    if (node.dropout) kept.draws.push_back(node.dropout->bytes());
    if (!node.cast) continue;
    if (!storages_[node.created.front().second].saved) {
      node.cast.reset();  // autograd did not save it: no replay needs it
      continue;
    }
    offered.push_back(n);
    bytes.push_back(node.cast->bytes);
  }
  const std::vector<bool> keep =
      casts_within(bytes, cast_room(budget, saved_bytes_from_ops_, kept.draw_bytes()));
  for (std::size_t i = 0; i < offered.size(); ++i) {
    if (keep[i]) {
      nodes_[offered[i]].cast->hold();
      kept.casts.push_back(bytes[i]);
    } else {
      nodes_[offered[i]].cast.reset();
    }
  }
  return kept;
}

void ForwardTrace::saved(std::size_t index, const at::Tensor& tensor) {
  saved_.push_back(TraceSaved{index, static_cast<uint32_t>(nodes_.size()), use_of(tensor)});
  const uint32_t id = saved_.back().use.storage;
  if (id >= storages_.size()) return;  // undefined or unsupported
  TraceStorage& s = storages_[id];
  s.read = true;
  if (s.source == TraceStorage::Source::Op && !s.saved) {
    s.saved = true;
    saved_bytes_from_ops_ += static_cast<int64_t>(tensor.storage().nbytes());
  }
}

}  // namespace recompose::detail
