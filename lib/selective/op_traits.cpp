#include "op_traits.h"

#include "op_names.h"

#include <ATen/core/enum_tag.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace recompose::detail {
namespace {

// Every overload of these ops (upstream lists the default overloads; the others are metadata
// queries too).
bool is_ignored(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> names{
      "aten::detach",
      "prim::device",
      "aten::is_contiguous",
      "aten::is_strides_like_format",
      "aten::is_non_overlapping_and_dense",
      "aten::size",
      "aten::sym_size",
      "aten::stride",
      "aten::sym_stride",
      "aten::storage_offset",
      "aten::sym_storage_offset",
      "aten::numel",
      "aten::sym_numel",
      "aten::dim",
  };
  return names.contains(name.name);
}

bool takes_generator(const c10::FunctionSchema& schema) {
  for (const c10::Argument& arg : schema.arguments()) {
    const c10::TypePtr& type = arg.real_type();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
    if (auto opt = type->cast<c10::OptionalType>();
        opt && opt->getElementType()->kind() == c10::TypeKind::GeneratorType) {
      return true;
    }
  }
  return false;
}

bool writes_undeclared(const c10::OperatorName& name) {
  static const char* const names[] = {"aten::native_batch_norm", "aten::cudnn_batch_norm",
                                      "aten::miopen_batch_norm", "aten::_batch_norm_impl_index"};
  for (const char* n : names) {
    if (name.name == n) return true;
  }
  return false;
}

// See OpTraits::inplace_argument.
int32_t inplace_argument(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::inplace_view)) return -1;
  static const char* const relayouts[] = {"aten::resize_", "aten::resize_as_", "aten::set_",
                                          "aten::_resize_output_", "aten::resize_as_sparse_"};
  const c10::FunctionSchema& schema = op.schema();
  for (const char* name : relayouts) {
    if (schema.name() == name) return -1;
  }
  int32_t written = -1;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    if (written >= 0 || arguments[i].is_out() ||
        arguments[i].type()->kind() != c10::TypeKind::TensorType)
      return -1;
    written = static_cast<int32_t>(i);
  }
  if (written < 0) return -1;
  const c10::AliasInfo& set = *arguments[static_cast<size_t>(written)].alias_info();
  for (const c10::Argument& r : schema.returns()) {
    if (r.alias_info() == nullptr || r.alias_info()->beforeSets() != set.beforeSets()) return -1;
  }
  return written;
}

OpTraits compute(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::OperatorName& name = op.operator_name();
  OpTraits t;
  t.ignored = is_ignored(name);
  bool writes_return = false;
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* alias = r.alias_info();
    if (alias == nullptr) continue;
    t.returns_alias = true;
    writes_return = writes_return || alias->isWrite();
    t.returns_unwritten_alias = t.returns_unwritten_alias || !alias->isWrite();
  }
  t.view = t.returns_alias && !writes_return;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias != nullptr && alias->isWrite())
      t.written_arguments.push_back(static_cast<uint32_t>(i));
  }
  t.writes_argument = !t.written_arguments.empty();
  t.writes_undeclared = writes_undeclared(name);
  t.random = op.hasTag(at::Tag::nondeterministic_seeded) || takes_generator(schema);
  t.draw = name.name == "aten::bernoulli_" &&
           (name.overload_name == "float" || name.overload_name == "Tensor");
  t.native_dropout = name.name == "aten::native_dropout" && name.overload_name.empty();
  t.to_copy = name.name == "aten::_to_copy" && name.overload_name.empty();
  // What it runs instead must be registered too (it is, in every LibTorch of the range).
  static const bool softmax_registered = find_overload("aten::softmax.int").has_value();
  t.cheaper_replay =
      name.name == "aten::_safe_softmax" && name.overload_name.empty() && softmax_registered;
  t.inplace_argument = inplace_argument(op);
  t.carriable = !t.random && t.inplace_argument >= 0;
  t.name_hash = std::hash<std::string>{}(name.name);
  return t;
}

// The traits of every operator asked about, by handle: an open-addressing table of pointers that
// readers probe without a lock; inserts and removals under a mutex. Entries are never freed, so a
// reference handed out stays valid, also after its operator is forgotten.
class TraitsTable {
 public:
  TraitsTable() {
    for (auto& s : slots_) s.store(nullptr, std::memory_order_relaxed);
  }

  const OpTraits* find(const c10::OperatorHandle& op) const {
    size_t i = home(op);
    for (size_t probe = 0; probe < kSlots; ++probe, i = (i + 1) & (kSlots - 1)) {
      const Entry* e = slots_[i].load(std::memory_order_acquire);
      if (e == nullptr) return nullptr;
      if (e != gone_ && e->op == op) return &e->traits;
    }
    return nullptr;
  }

  const OpTraits& insert(const c10::OperatorHandle& op, const OpTraits& traits) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const OpTraits* t = find(op)) return *t;  // another thread was first
    if (auto it = overflow_.find(op); it != overflow_.end()) return it->second->traits;
    const Entry* e = &entries_.emplace_back(Entry{op, traits});
    if (used_ + 1 > kSlots / 4 * 3) {  // full enough: later ones are found under the lock
      overflow_.emplace(op, e);
      return e->traits;
    }
    size_t i = home(op);
    while (true) {
      const Entry* s = slots_[i].load(std::memory_order_relaxed);
      if (s == nullptr || s == gone_) break;
      i = (i + 1) & (kSlots - 1);
    }
    if (slots_[i].load(std::memory_order_relaxed) == nullptr) ++used_;
    slots_[i].store(e, std::memory_order_release);
    return e->traits;
  }

  // Past the lock-free table (never reached with today's operator counts).
  const OpTraits* find_overflow(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = overflow_.find(op);
    return it == overflow_.end() ? nullptr : &it->second->traits;
  }

  void forget(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    overflow_.erase(op);
    size_t i = home(op);
    for (size_t probe = 0; probe < kSlots; ++probe, i = (i + 1) & (kSlots - 1)) {
      const Entry* e = slots_[i].load(std::memory_order_relaxed);
      if (e == nullptr) return;
      if (e != gone_ && e->op == op) {
        slots_[i].store(gone_, std::memory_order_release);  // keeps the probe chains whole
        return;
      }
    }
  }

 private:
  struct Entry {
    c10::OperatorHandle op;
    OpTraits traits;
  };
  // A power of two; LibTorch registers a few thousand operators, a program calls a few hundred.
  static constexpr size_t kSlots = size_t{1} << 14;

  static size_t home(const c10::OperatorHandle& op) {
    const uint64_t h = std::hash<c10::OperatorHandle>{}(op);
    return static_cast<size_t>((h * 0x9E3779B97F4A7C15ULL) >> (64 - 14));
  }

  std::array<std::atomic<const Entry*>, kSlots> slots_;
  std::mutex mutex_;
  std::deque<Entry> entries_;  // the entries' storage: stable addresses
  std::unordered_map<c10::OperatorHandle, const Entry*> overflow_;
  size_t used_ = 0;  // slots ever filled (a removed entry's slot stays in its chain)
  // A forgotten operator's slot: never dereferenced, only compared.
  static constexpr char kGoneTag = 0;
  const Entry* const gone_ = reinterpret_cast<const Entry*>(&kGoneTag);
};

// Forgets an operator when its schema is deregistered: a new one may take its handle.
class ForgetOnDeregistration final : public c10::OpRegistrationListener {
 public:
  explicit ForgetOnDeregistration(TraitsTable& table) : table_(table) {}
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& op) override { table_.forget(op); }

 private:
  TraitsTable& table_;
};

TraitsTable& table() {
  // Never destroyed: LibTorch deregisters its operators as the process exits, after this
  // library's statics may be gone, and the listener is called then. Both held by static
  // pointers, so that they stay reachable and LeakSanitizer reports only real leaks; the
  // listener's [[gnu::used]], because GCC removes a static that is written and never read (at
  // -O2), and the pointer with it.
  static TraitsTable* const t = new TraitsTable();
  [[gnu::used]] static c10::RegistrationHandleRAII* const listener =
      new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
          std::make_unique<ForgetOnDeregistration>(*t)));
  (void)listener;
  return *t;
}

}  // namespace

const OpTraits& OpTraits::of(const c10::OperatorHandle& op) {
  TraitsTable& t = table();
  if (const OpTraits* found = t.find(op)) return *found;
  if (const OpTraits* found = t.find_overflow(op)) return *found;
  // Computed outside the table's lock: computing may ask the dispatcher, whose lock is held
  // when it calls ForgetOnDeregistration.
  return t.insert(op, compute(op));
}

bool autocast_cacheable_cast(const OpTraits& traits, const c10::OperatorHandle& op,
                             const torch::jit::Stack& stack) {
  if (!traits.to_copy) return false;
  // _to_copy(Tensor self, *, ScalarType? dtype, ...): the condition of autocast's cached_cast.
  const size_t n_args = op.schema().arguments().size();
  const c10::IValue& self = stack[stack.size() - n_args];
  const c10::IValue& dtype = stack[stack.size() - n_args + 1];
  if (!self.isTensor() || dtype.isNone()) return false;
  const at::Tensor& t = self.toTensor();
  const auto to = dtype.toScalarType();
  return t.defined() && t.scalar_type() == at::kFloat && (to == at::kBFloat16 || to == at::kHalf) &&
         t.requires_grad() && t.is_leaf() && !t.is_view();
}

}  // namespace recompose::detail
