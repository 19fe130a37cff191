#include "cache_entry.h"
#include "trace_tensors.h"

#include "engine/internal_ops.h"

#include <ATen/ops/empty.h>

#include <recompose/checkpoint_error.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/core/List.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

namespace recompose::detail {
namespace {

// A new TensorImpl on the same storage with a version counter of its own: what a recomputation
// gets from an entry that carries the forward's later writes (accept_write), which it skips but
// autograd still counts (ADInplaceOrView bumps the counter of the tensor handed out): the count
// must not reach the forward's tensors, which other entries may still check.
at::Tensor with_own_version(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::Tensor(t.unsafeGetTensorImpl()->shallow_copy_and_detach(
      c10::VariableVersion(/*version=*/0), /*allow_tensor_metadata_change=*/false));
}

// Applies f to every tensor of v (tensors, tensor lists, optional-tensor lists).
template <class F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    }
    return out;
  }
  return v;
}

// Inference tensors have no version counter; they cannot be modified unnoticed by autograd
// either, so they are not checked.
constexpr uint32_t kUntracked = UINT32_MAX;
uint32_t version_of(const at::Tensor& t) {
  const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
  return vc.enabled() ? vc.current_version() : kUntracked;
}

std::atomic<int64_t> g_bytes_kept{0};

}  // namespace

CacheEntry::CacheEntry(CacheEntry&& other) noexcept
    : values_(std::move(other.values_)),
      versions_(std::move(other.versions_)),
      swapped_(std::move(other.swapped_)),
      swapped_storages_(std::move(other.swapped_storages_)),
      swap_(other.swap_),
      written_after_capture_(other.written_after_capture_),
      carries_writes_(other.carries_writes_),
      bytes_(other.bytes_),
      charges_(std::move(other.charges_)) {
  other.bytes_ = 0;
}

CacheEntry& CacheEntry::operator=(CacheEntry&& other) noexcept {
  if (this != &other) {
    release();
    values_ = std::move(other.values_);
    versions_ = std::move(other.versions_);
    swapped_ = std::move(other.swapped_);
    swapped_storages_ = std::move(other.swapped_storages_);
    swap_ = other.swap_;
    written_after_capture_ = other.written_after_capture_;
    carries_writes_ = other.carries_writes_;
    bytes_ = other.bytes_;
    charges_ = std::move(other.charges_);
    other.bytes_ = 0;
  }
  return *this;
}

// The bytes of the storages this entry holds (each once), added to the process-wide figure, and
// each storage charged to the forward thread's meters and ledger as a storage, not as bytes: a
// meter counts a storage once however many hold it (a kept output that is also the next region's
// input, which that region saves).
void CacheEntry::account() {
  g_bytes_kept.fetch_sub(bytes_, std::memory_order_relaxed);
  bytes_ = 0;
  charges_.clear();
  c10::SmallVector<const c10::StorageImpl*, 4> seen;
  for (const c10::IValue& v : values_) {
    map_tensors(v, [&](const at::Tensor& t) {
      // Offloaded tensors' markers hold no device memory.
      if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return t;
      const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
      if (std::find(seen.begin(), seen.end(), st) != seen.end()) return t;
      seen.push_back(st);
      bytes_ += static_cast<int64_t>(st->nbytes());
      charges_.emplace_back(t);
      return t;
    });
  }
  g_bytes_kept.fetch_add(bytes_, std::memory_order_relaxed);
}

CacheEntry CacheEntry::capture(c10::ArrayRef<c10::IValue> outputs, Offloader* swap) {
  CacheEntry e;
  e.swap_ = swap;
  e.values_.reserve(outputs.size());
  for (const c10::IValue& v : outputs) {
    e.values_.push_back(map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      e.versions_.push_back(version_of(t));
      if (swap != nullptr && swap->eligible(t)) {
        e.swapped_.push_back(swap->offload(t));
        if (t.has_storage()) e.swapped_storages_.push_back(t.storage().unsafeGetStorageImpl());
        // Holds no memory but shares the version counter, so the mutation check still works.
        InternalOpsGuard internal;  // recompose's op: no region may record it
        at::Tensor marker = at::empty({0}, t.options());
        marker.unsafeGetTensorImpl()->set_version_counter(
            t.unsafeGetTensorImpl()->version_counter());
        return marker;
      }
      e.swapped_.push_back(nullptr);
      return alias_of(t);
    }));
  }
  e.account();
  return e;
}

void CacheEntry::hand_out(const c10::OperatorHandle& op, int64_t call_index, bool allow_mutation,
                          torch::jit::Stack* stack) const {
  // Check everything before pushing anything: an error leaves the stack as it was.
  check_unmodified(op, call_index, allow_mutation);
  size_t j = 0;
  for (const c10::IValue& v : values_) {
    torch::jit::push(*stack, map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      const auto& swapped = swapped_[j++];
      // get() waits for (or launches) the reload; the stream that needs it waits on its event.
      // Its copies are recompose's ops: no region may record them.
      if (!swapped) return carries_writes_ ? with_own_version(t) : alias_of(t);
      InternalOpsGuard internal;
      // A reload may be shared with other entries (another region that kept the same output):
      // one the recomputation will write into must be a copy of its own.
      at::Tensor reloaded = swapped->get();
      return written_after_capture_ ? reloaded.clone() : alias_of(reloaded);
    }));
  }
}

void CacheEntry::check_unmodified(const c10::OperatorHandle& op, int64_t call_index,
                                  bool allow_mutation) const {
  if (allow_mutation || !modified()) return;
  throw CheckpointError("recompose: selective checkpoint: the output of " + op.schema().name() +
                        " (call " + std::to_string(call_index) +
                        " in the region) that was saved in the forward has been modified in "
                        "place since. Avoid modifying it in place, or pass "
                        "allow_cache_entry_mutation = true to use the modified values.");
}

bool CacheEntry::modified() const {
  bool changed = false;
  size_t k = 0;
  for (const c10::IValue& v : values_) {
    map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      const uint32_t kept = versions_[k++];
      changed = changed || (kept != kUntracked && version_of(t) != kept);
      return t;
    });
  }
  return changed;
}

void CacheEntry::copy_on_write() {
  // The copies are recompose's ops, not the program's: an enclosing selective region must not
  // record them (it would replay one in place of a clone of the program's).
  InternalOpsGuard internal;
  // An offloaded output's host copy is what the replay needs, as long as it has landed before
  // the write: wait for the copies in flight (the write has not been launched yet), then keep it.
  if (swap_ != nullptr && !swapped_storages_.empty()) swap_->synchronize();
  written_after_capture_ = true;
  versions_.clear();
  size_t j = 0;
  for (c10::IValue& v : values_) {
    v = map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      if (swapped_[j++]) {
        // A fresh marker: later writes to the original no longer concern this entry.
        at::Tensor marker = at::empty({0}, t.options());
        versions_.push_back(version_of(marker));
        return marker;
      }
      at::Tensor copy = t.clone();
      versions_.push_back(version_of(copy));
      return copy;
    });
  }
  swapped_storages_.clear();
  account();
}

void CacheEntry::accept_write() {
  carries_writes_ = true;
  versions_.clear();
  for (const c10::IValue& v : values_) {
    map_tensors(v, [&](const at::Tensor& t) {
      if (t.defined()) versions_.push_back(version_of(t));
      return t;
    });
  }
}

bool CacheEntry::offloaded() const {
  return std::any_of(swapped_.begin(), swapped_.end(), [](const auto& s) { return s != nullptr; });
}

c10::SmallVector<const c10::StorageImpl*, 4> CacheEntry::storages() const {
  auto out = device_storages();
  out.append(swapped_storages_.begin(), swapped_storages_.end());
  return out;
}

c10::SmallVector<const c10::StorageImpl*, 4> CacheEntry::device_storages() const {
  c10::SmallVector<const c10::StorageImpl*, 4> out;
  for (const c10::IValue& v : values_) {
    map_tensors(v, [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage() && t.storage().nbytes() > 0)
        out.push_back(t.storage().unsafeGetStorageImpl());
      return t;
    });
  }
  return out;
}

void CacheEntry::release() noexcept {
  g_bytes_kept.fetch_sub(bytes_, std::memory_order_relaxed);
  charges_.clear();
  bytes_ = 0;
  values_.clear();
  values_.shrink_to_fit();
  versions_.clear();
  swapped_.clear();  // frees the host copies (back to the manager's pool)
  swapped_storages_.clear();
}

void count_bytes_kept(int64_t delta) noexcept {
  g_bytes_kept.fetch_add(delta, std::memory_order_relaxed);
}

}  // namespace recompose::detail

namespace recompose {

int64_t selective_checkpoint_bytes_kept() {
  return detail::g_bytes_kept.load(std::memory_order_relaxed);
}

}  // namespace recompose
