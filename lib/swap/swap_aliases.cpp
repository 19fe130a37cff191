#include "swap/swap_aliases.h"

#include <algorithm>

namespace recompose::detail {

SwapEntry* SwapAliases::find(const at::Tensor& source) const {
  auto it = by_storage_.find(source.storage().unsafeGetStorageImpl());
  if (it == by_storage_.end()) return nullptr;
  const int64_t version = source._version();
  for (const Alias& alias : it->second) {
    const SwapEntry& e = *alias.entry;
    if (e.state == SwapState::Released || alias.storage.expired()) continue;
    if (alias.storage_offset != source.storage_offset() || alias.version != version) continue;
    if (e.host_view.scalar_type() != source.scalar_type() ||
        e.host_view.sizes() != source.sizes() || e.host_view.strides() != source.strides()) {
      continue;
    }
    return alias.entry;
  }
  return nullptr;
}

void SwapAliases::add(SwapEntry& entry, const at::Tensor& source) {
  entry.storage_key = source.storage().unsafeGetStorageImpl();
  by_storage_[entry.storage_key].push_back(Alias{&entry, source.storage().getWeakStorageImpl(),
                                                 source.storage_offset(), source._version()});
}

void SwapAliases::remove(const SwapEntry& entry) {
  auto it = by_storage_.find(entry.storage_key);
  if (it == by_storage_.end()) return;
  std::erase_if(it->second, [&](const Alias& alias) { return alias.entry == &entry; });
  if (it->second.empty()) by_storage_.erase(it);
}

int64_t SwapAliases::entries() const {
  auto n = static_cast<int64_t>(by_storage_.size());
  for (const auto& [key, list] : by_storage_) n += static_cast<int64_t>(list.size());
  return n;
}

}  // namespace recompose::detail
