#include "forward_trace.h"

#include "engine/kernels_only.h"
#include "replay_substitute.h"

#include <ATen/core/List.h>
#include <ATen/ops/as_strided.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace recompose::detail {
namespace {

// Why a replay gave up (caught in replay(), which then reports it).
struct Fallback {
  std::string why;
};

// A new TensorImpl on the same storage, sharing the version counter (no dispatch).
at::Tensor alias_of(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(),
                                                  /*allow_tensor_metadata_change=*/false));
}

uint32_t version_of(const at::Tensor& t) {
  const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
  return vc.enabled() ? vc.current_version() : 0;
}

// Calls f(k, tensor) for the tensors among the top `n` values of `stack`, numbered in order
// (lists flattened); the same numbering in the forward and in the replay.
template <class F>
void for_each_output(const torch::jit::Stack& stack, std::size_t n, F&& f) {
  uint32_t k = 0;
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      f(k++, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) f(k++, t);
    }
  }
}

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

// aten::native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
constexpr std::size_t kRunningMean = 3, kRunningVar = 4, kTraining = 5;

// Note [ Batch norm replayed without its running statistics ]
// native_batch_norm in training normalises with the batch's own statistics and writes the running
// statistics beside (its schema does not say so). Its outputs do not read the running statistics,
// so a replay runs it with None for them: the same bits, and no second update of the module's
// buffers. In eval it only reads them, as any op reads an outside tensor. Other batch-norm kernels
// (cudnn, miopen) still fall back.
//
// The training flag of a native_batch_norm call on `stack`; nullopt for any other op.
std::optional<bool> native_batch_norm_training(const c10::OperatorHandle& op,
                                               const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  if (op.operator_name().name != "aten::native_batch_norm" || arguments.size() != 8 ||
      stack.size() < arguments.size())
    return std::nullopt;
  const c10::IValue& training = stack[stack.size() - arguments.size() + kTraining];
  if (!training.isBool()) return std::nullopt;
  return training.toBool();
}

}  // namespace

void ForwardTrace::for_each_kept(
    const std::function<void(const c10::OperatorHandle&, OpCalls&, uint32_t)>& f) const {
  for (const Node& node : nodes_) {
    if (node.kept_calls != nullptr) f(node.op, *node.kept_calls, node.kept_slot);
  }
}

TensorGeometry TensorGeometry::of(const at::Tensor& t) {
  TensorGeometry g;
  g.sizes.assign(t.sizes().begin(), t.sizes().end());
  g.strides.assign(t.strides().begin(), t.strides().end());
  g.offset = t.storage_offset();
  g.dtype = t.scalar_type();
  return g;
}

bool TensorGeometry::same_shape(const at::Tensor& t) const {
  return t.scalar_type() == dtype && t.sizes() == c10::IntArrayRef(sizes) &&
         t.strides() == c10::IntArrayRef(strides);
}

uint32_t ForwardTrace::add_storage(const at::Tensor& t, Storage::Source source) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  Storage s;
  s.source = source;
  s.key = impl;
  s.weak = c10::weak_intrusive_ptr<c10::StorageImpl>(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  s.base = TensorGeometry::of(t);
  const auto id = static_cast<uint32_t>(storages_.size());
  storages_.push_back(std::move(s));
  index_.emplace(impl, id);
  return id;
}

uint32_t ForwardTrace::storage_of(const at::Tensor& t) {
  auto it = index_.find(t.storage().unsafeGetStorageImpl());
  if (it != index_.end()) return it->second;
  // First sight of a tensor from outside the region (a parameter, a captured tensor): kept.
  const uint32_t id = add_storage(t, Storage::Source::Outside);
  storages_[id].outside = alias_of(t);
  storages_[id].outside_version = version_of(t);
  return id;
}

TensorUse ForwardTrace::use_of(const at::Tensor& t) {
  TensorUse u;
  if (!t.defined()) return u;
  if (!t.has_storage() || t.layout() != at::kStrided || t.is_conj() || t.is_neg() ||
      t.is_nested()) {
    u.storage = TensorUse::kUnsupported;
    return u;
  }
  u.storage = storage_of(t);
  u.version = static_cast<uint32_t>(storages_[u.storage].writers.size());
  u.geometry = TensorGeometry::of(t);
  return u;
}

void ForwardTrace::add_inputs(const std::vector<at::Tensor>& inputs) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided || t.is_conj() || t.is_neg())
      continue;
    if (index_.contains(t.storage().unsafeGetStorageImpl()))
      continue;  // a view of an earlier input
    storages_[add_storage(t, Storage::Source::Input)].input = static_cast<uint32_t>(i);
  }
}

void ForwardTrace::begin(const c10::OperatorHandle& op, const OpTraits& traits,
                         const torch::jit::Stack& stack) {
  if (pending_) poisoned_ = true;  // the previous op threw
  pending_ = true;
  Node& node = nodes_.emplace_back(op, traits);
  const bool hidden_writes = traits.writes_undeclared;
  node.hidden_writes = hidden_writes;
  const auto& arguments = op.schema().arguments();
  const std::size_t base = stack.size() - arguments.size();
  // See Note [ Batch norm replayed without its running statistics ].
  const std::optional<bool> batch_norm_training =
      hidden_writes ? native_batch_norm_training(op, stack) : std::nullopt;
  if (batch_norm_training) node.hidden_writes = false;
  const bool drop_running_stats = batch_norm_training.value_or(false);
  node.args.resize(arguments.size());
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& v = stack[base + i];
    Arg& arg = node.args[i];
    arg.first = static_cast<uint32_t>(node.uses.size());
    if (drop_running_stats && (i == kRunningMean || i == kRunningVar)) {
      arg.kind = Arg::Kind::Constant;
      arg.constant = c10::IValue();  // None
      arg.count = 0;
      continue;
    }
    if (v.isTensor()) {
      arg.kind = Arg::Kind::Tensor;
      node.uses.push_back(use_of(v.toTensor()));
    } else if (v.isTensorList()) {
      arg.kind = Arg::Kind::TensorList;
      for (const at::Tensor& t : v.toTensorList()) node.uses.push_back(use_of(t));
    } else if (v.isOptionalTensorList()) {
      arg.kind = Arg::Kind::OptionalTensorList;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        node.uses.push_back(t.has_value() ? use_of(*t) : TensorUse{});
      }
    } else {
      if (holds_tensor(v)) node.unsupported = true;
      arg.constant = v;
    }
    arg.count = static_cast<uint32_t>(node.uses.size()) - arg.first;
    if (traits.writes(i)) {
      for (uint32_t u = arg.first; u < arg.first + arg.count; ++u) {
        const uint32_t s = node.uses[u].storage;
        if (s == TensorUse::kUnsupported) node.unsupported = true;
        if (s >= TensorUse::kUnsupported) continue;
        bool seen = false;
        for (uint32_t w : node.writes) seen = seen || w == s;
        if (!seen) node.writes.push_back(s);
      }
    }
  }
}

void ForwardTrace::end(const torch::jit::Stack& stack, OpCalls* kept_calls, uint32_t kept_slot,
                       std::unique_ptr<GeneratorEffect> rng, std::unique_ptr<DrawMask> draw) {
  pending_ = false;
  Node& node = nodes_.back();
  const auto n = static_cast<uint32_t>(nodes_.size() - 1);
  for_each_output(stack, node.op.schema().returns().size(), [&](uint32_t k, const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided) return;
    if (index_.contains(t.storage().unsafeGetStorageImpl()))
      return;  // a view of, or an alias to, a known storage
    const uint32_t id = add_storage(t, Storage::Source::Op);
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
    std::stable_sort(first_of_op, saved_.end(),
                     [](const Saved& a, const Saved& b) { return a.position < b.position; });
  }
  // The versions this op read are needed again if it runs again (in a replay, or in a forward run
  // again). An op that returns only tensors on storages known before (_unsafe_view) makes no
  // value of its own: its reads do not count (item's, equal's do).
  bool makes_values = !node.created.empty() || !node.writes.empty();
  for (std::size_t i = stack.size() - node.op.schema().returns().size(); i < stack.size(); ++i) {
    makes_values = makes_values || !(stack[i].isTensor() || stack[i].isTensorList());
  }
  if (makes_values) {
    for (const TensorUse& u : node.uses) {
      if (u.storage < TensorUse::kUnsupported) storages_[u.storage].read = true;
    }
  }
  node.kept_calls = kept_calls;
  node.kept_slot = kept_slot;
  if (kept_calls == nullptr && node.traits->cheaper_replay && !node.unsupported) {
    c10::SmallVector<c10::IValue, 4> constants;
    for (const Arg& arg : node.args) constants.push_back(arg.constant);
    const std::size_t n_out = node.op.schema().returns().size();
    if (n_out > 0 && n_out <= stack.size() && stack[stack.size() - n_out].isTensor()) {
      node.replay_as =
          cheaper_replay_op(node.op, constants, stack[stack.size() - n_out].toTensor());
    }
  }
  node.rng = std::move(rng);
  if (draw && !node.args.empty() && node.args[0].kind == Arg::Kind::Tensor &&
      node.args[0].count == 1) {
    node.draw = std::move(draw);  // written into the first argument, as bernoulli_ draws into self
  }
  node.complete = true;
}

bool ForwardTrace::kept_output_unread(const at::Tensor& written, const OpCalls* calls,
                                      uint32_t slot) const {
  if (poisoned_ || pending_ || !written.has_storage()) return false;
  auto it = index_.find(written.storage().unsafeGetStorageImpl());
  if (it == index_.end()) return false;
  const Storage& s = storages_[it->second];
  return s.source == Storage::Source::Op && nodes_[s.op].kept_calls == calls &&
         nodes_[s.op].kept_slot == slot && !s.read;
}

void ForwardTrace::carry_write(const at::Tensor& written) {
  Storage& s = storages_[index_.at(written.storage().unsafeGetStorageImpl())];
  s.kept_version = static_cast<uint32_t>(s.writers.size());
  ++writes_carried_;
  s.read = false;  // the writer's own read of the value before is behind the kept value now
}

void ForwardTrace::release_draws() {
  for (Node& node : nodes_) node.draw.reset();
}

void ForwardTrace::saved(std::size_t index, const at::Tensor& tensor) {
  saved_.push_back(Saved{index, static_cast<uint32_t>(nodes_.size()), use_of(tensor)});
  const uint32_t id = saved_.back().use.storage;
  if (id >= storages_.size()) return;  // undefined or unsupported
  Storage& s = storages_[id];
  s.read = true;
  if (s.source == Storage::Source::Op && !s.saved) {
    s.saved = true;
    saved_bytes_from_ops_ += static_cast<int64_t>(tensor.storage().nbytes());
  }
}

ReplayOutcome ForwardTrace::replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
                                   const std::vector<bool>& needed, const ReplayKept& replay_kept,
                                   std::vector<at::Tensor>& out) const {
  ReplayOutcome outcome;
  try {
    if (poisoned_ || pending_) throw Fallback{"an op of the forward threw"};
    if (saved_.size() != needed.size())
      throw Fallback{"its forward context did not see every tensor the region saved"};
    const std::size_t n_nodes = nodes_.size();
    // 1. Which ops to run: the producers of the versions the needed saved tensors read, and
    //    theirs, back to kept outputs, inputs and outside tensors. Producers precede consumers:
    //    one backward pass over the ops.
    std::vector<char> run(n_nodes, 0);
    // The uses an op to run reads: a kept draw reads only the tensor it is written into.
    auto uses_read = [&](const Node& node) -> c10::ArrayRef<TensorUse> {
      if (node.draw)
        return c10::ArrayRef<TensorUse>(node.uses).slice(node.args[0].first, node.args[0].count);
      return node.uses;
    };
    auto mark = [&](const TensorUse& use) {
      if (use.storage == TensorUse::kUndefined) return;
      if (use.storage == TensorUse::kUnsupported) {
        throw Fallback{
            "a tensor it needs has no strided storage or has its conjugate or negative bit set"};
      }
      const Storage& s = storages_[use.storage];
      if (s.source == Storage::Source::Op && use.version == s.kept_version) {
        run[s.op] = 1;  // what its op made, or a value the kept output carries (carry_write)
      } else if (use.version < s.kept_version) {
        throw Fallback{
            "internal error: it needs the value of a kept output before a write the kept output "
            "carries"};
      } else if (use.version > 0) {
        if (s.source != Storage::Source::Op) {
          throw Fallback{
              "it needs a region input or an outside tensor after an op of the region wrote into "
              "it"};
        }
        run[s.writers[use.version - 1]] = 1;
      }
    };
    for (const Saved& s : saved_) {
      if (s.index < needed.size() && needed[s.index]) mark(s.use);
    }
    for (std::size_t n = n_nodes; n-- > 0;) {
      if (!run[n]) continue;
      const Node& node = nodes_[n];
      if (!node.complete || node.unsupported) {
        throw Fallback{"it needs " + node.op.schema().name() +
                       ", whose arguments it cannot rebuild"};
      }
      if (node.hidden_writes && node.kept_calls == nullptr) {
        throw Fallback{"it needs " + node.op.schema().name() +
                       ", which writes into arguments its schema does not declare (batch norm's "
                       "running statistics)"};
      }
      for (uint32_t w : node.writes) {
        if (storages_[w].source != Storage::Source::Op) {
          throw Fallback{"it needs " + node.op.schema().name() +
                         ", which writes into a tensor from outside the region"};
        }
        if (node.kept_calls != nullptr) {
          throw Fallback{"it needs " + node.op.schema().name() +
                         ", a kept op that writes into an argument"};
        }
      }
      if (node.kept_calls != nullptr) continue;  // answered by its cache entry
      if (node.rng && !rng_preserved) {
        throw Fallback{"it needs the random op " + node.op.schema().name() +
                       " and preserve_rng_state is off"};
      }
      for (const TensorUse& u : uses_read(node)) mark(u);
    }
    // The last op that will write into each storage: a saved tensor read before it is copied.
    // The last step that reads each (step n: the saved tensors of position n, then op n): its
    // tensor is dropped after it, so that the replay holds no more than the recomputation did.
    std::vector<int64_t> last_write(storages_.size(), -1);
    std::vector<int64_t> last_use(storages_.size(), -1);
    std::vector<char> viewed(storages_.size(),
                             0);  // a use in another layout than the storage's tensor
    auto note_use = [&](const TensorUse& u, int64_t step) {
      if (u.storage >= TensorUse::kUnsupported) return;
      const Storage& s = storages_[u.storage];
      last_use[u.storage] = std::max(last_use[u.storage], step);
      if (u.geometry == s.base) return;
      if (u.geometry.dtype != s.base.dtype)
        throw Fallback{"it needs a view of another dtype than its base"};
      viewed[u.storage] = 1;
    };
    for (std::size_t n = 0; n < n_nodes; ++n) {
      if (!run[n]) continue;
      for (uint32_t w : nodes_[n].writes) last_write[w] = static_cast<int64_t>(n);
      if (nodes_[n].kept_calls != nullptr) continue;
      for (const TensorUse& u : uses_read(nodes_[n])) note_use(u, static_cast<int64_t>(n));
    }
    for (const Saved& s : saved_) {
      if (needed[s.index]) note_use(s.use, s.position);
    }
    std::vector<std::vector<uint32_t>> drop_after(n_nodes + 1);
    for (uint32_t id = 0; id < storages_.size(); ++id) {
      if (last_use[id] < 0) continue;
      drop_after[static_cast<std::size_t>(last_use[id])].push_back(id);
      // What can be checked before anything runs is checked here: the replay hands kept outputs
      // out (and the cache releases them) as it goes, so it should not give up half-way.
      const Storage& s = storages_[id];
      if (s.source == Storage::Source::Outside && version_of(s.outside) != s.outside_version) {
        throw Fallback{
            "a tensor from outside the region (a parameter?) was modified in place since the "
            "forward"};
      }
      if (s.source == Storage::Source::Input) {
        if (s.input >= inputs.size() || !inputs[s.input].defined() ||
            !s.base.same_shape(inputs[s.input])) {
          throw Fallback{"a region input came back in another layout"};
        }
        if (viewed[id] && inputs[s.input].storage().unsafeGetStorageImpl() != s.key) {
          throw Fallback{
              "it needs a view of a region input that came back as another tensor (recomputed "
              "by an enclosing checkpointed region, or offloaded and reloaded)"};
        }
      }
    }

    // 2. Run them below autograd and autocast, seen by no dispatch mode, with the generators of
    //    random ops where the forward found them (put back afterwards).
    KernelsOnlyGuard kernels_only;
    std::vector<at::Generator> generators;
    for (std::size_t n = 0; n < n_nodes; ++n) {
      if (run[n] && nodes_[n].rng && !nodes_[n].draw) nodes_[n].rng->collect(generators);
    }
    GeneratorStash stash(std::move(generators));

    struct Base {
      at::Tensor tensor;
      int64_t delta = 0;      // its storage offset minus the forward's
      bool views_ok = false;  // on the forward's storage, or a copy laid out alike
    };
    std::vector<Base> bases(storages_.size());
    auto set_base = [&](uint32_t id, at::Tensor t, bool copy) {
      const Storage& s = storages_[id];
      if (last_use[id] < 0) return;  // an output nothing reads (a second output of the op...)
      if (copy) t = t.clone();
      if (!s.base.same_shape(t)) {
        throw Fallback{"an op it ran returned a tensor laid out otherwise than in the forward"};
      }
      bases[id] = Base{std::move(t), 0, true};
      bases[id].delta = bases[id].tensor.storage_offset() - s.base.offset;
    };
    auto base_of = [&](uint32_t id) -> const Base& {
      Base& b = bases[id];
      if (b.tensor.defined()) return b;
      const Storage& s = storages_[id];
      if (s.source == Storage::Source::Input) {
        const at::Tensor& t = s.input < inputs.size() ? inputs[s.input] : at::Tensor();
        if (!t.defined() || !s.base.same_shape(t))
          throw Fallback{"a region input came back in another layout"};
        // A copy of the input (offloaded and reloaded) holds the input, not the rest of its
        // storage.
        b = Base{t, t.storage_offset() - s.base.offset,
                 t.storage().unsafeGetStorageImpl() == s.key};
      } else if (s.source == Storage::Source::Outside) {
        if (version_of(s.outside) != s.outside_version) {
          throw Fallback{
              "a tensor from outside the region (a parameter?) was modified in place since the "
              "forward"};
        }
        b = Base{s.outside, 0, true};
      } else {
        throw Fallback{"internal error: an op output was needed before its op ran"};
      }
      return b;
    };
    auto materialize = [&](const TensorUse& use) -> at::Tensor {
      if (use.storage == TensorUse::kUndefined) return at::Tensor();
      const Storage& s = storages_[use.storage];
      const Base& b = base_of(use.storage);
      if (use.geometry == s.base) return b.tensor;
      if (use.geometry.dtype != s.base.dtype)
        throw Fallback{"it needs a view of another dtype than its base"};
      if (!b.views_ok) throw Fallback{"it needs a view of a region input that came back as a copy"};
      return at::as_strided(b.tensor, use.geometry.sizes, use.geometry.strides,
                            use.geometry.offset + b.delta);
    };

    out.assign(needed.size(), at::Tensor());
    std::size_t next_saved = 0;
    auto emit_saved = [&](std::size_t position) {
      for (; next_saved < saved_.size() && saved_[next_saved].position <= position; ++next_saved) {
        const Saved& s = saved_[next_saved];
        if (s.index >= needed.size() || !needed[s.index]) continue;
        at::Tensor value = materialize(s.use);
        if (!value.defined()) continue;
        // Read before a later op of the replay writes into it: a copy of the value it has now.
        out[s.index] = last_write[s.use.storage] >= static_cast<int64_t>(position)
                           ? value.clone()
                           : alias_of(value);
      }
    };
    torch::jit::Stack stack;
    auto drop_unread = [&](std::size_t n) {
      for (uint32_t id : drop_after[n]) bases[id] = Base{};
    };
    for (std::size_t n = 0; n < n_nodes; ++n) {
      emit_saved(n);
      if (!run[n]) {
        if (nodes_[n].kept_calls == nullptr) ++outcome.ops_skipped;
        drop_unread(n);
        continue;
      }
      const Node& node = nodes_[n];
      stack.clear();
      const std::size_t n_out = node.op.schema().returns().size();
      if (node.kept_calls != nullptr) {
        const bool own = replay_kept(node.op, *node.kept_calls, node.kept_slot, &stack);
        for (const auto& [k, id] : node.created) {
          // The replay writes into it: not into a tensor someone else holds (the cache's copy made
          // for the forward's own write, as sdpa's in-place mask add into bmm's output, is not).
          const bool copy = last_write[id] >= 0 && !own;
          for_each_output(stack, n_out, [&](uint32_t j, const at::Tensor& t) {
            if (j == k) set_base(id, t, copy);
          });
        }
        stack.clear();
        drop_unread(n);
        continue;
      }
      if (node.draw) {
        // The forward's draw, written back where it drew (its first argument): the op's result
        // without drawing. The generators stay where backward found them, as after a redraw.
        const auto t0 = std::chrono::steady_clock::now();
        if (!node.draw->write_into(materialize(node.uses[node.args[0].first]))) {
          throw Fallback{
              "internal error: the replay's tensor for a kept draw is laid out otherwise than in "
              "the forward"};
        }
        outcome.op_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
        ++outcome.draws_written;
        drop_unread(n);
        continue;
      }
      for (const Arg& arg : node.args) {
        switch (arg.kind) {
          case Arg::Kind::Constant:
            stack.push_back(arg.constant);
            break;
          case Arg::Kind::Tensor:
            stack.emplace_back(materialize(node.uses[arg.first]));
            break;
          case Arg::Kind::TensorList: {
            c10::List<at::Tensor> list;
            list.reserve(arg.count);
            for (uint32_t u = arg.first; u < arg.first + arg.count; ++u)
              list.push_back(materialize(node.uses[u]));
            stack.emplace_back(std::move(list));
            break;
          }
          case Arg::Kind::OptionalTensorList: {
            c10::List<std::optional<at::Tensor>> list;
            list.reserve(arg.count);
            for (uint32_t u = arg.first; u < arg.first + arg.count; ++u) {
              at::Tensor t = materialize(node.uses[u]);
              list.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
            }
            stack.emplace_back(std::move(list));
            break;
          }
        }
      }
      if (node.rng) node.rng->rewind();
      const auto t0 = std::chrono::steady_clock::now();
      (node.replay_as ? *node.replay_as : node.op).callBoxed(&stack);
      outcome.op_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
      ++outcome.ops_run;
      if (node.replay_as) ++outcome.ops_substituted;
      if (!node.created.empty()) {
        for_each_output(stack, stack.size(), [&](uint32_t k, const at::Tensor& t) {
          for (const auto& [j, id] : node.created) {
            if (j == k) set_base(id, t, false);
          }
        });
      }
      stack.clear();
      drop_unread(n);
    }
    emit_saved(n_nodes);
    outcome.writes_carried = writes_carried_;
    outcome.replayed = true;
  } catch (const Fallback& f) {
    out.clear();
    outcome = ReplayOutcome{};
    outcome.fallback_reason = f.why;
  }
  return outcome;
}

}  // namespace recompose::detail
