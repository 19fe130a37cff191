// A set of pointers for "each once" walks over module trees and their tensors: it searches
// linearly while small (a region's tree usually is: no hash set to allocate) and hashes once it
// grows (a region over a whole model).
#pragma once

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstddef>
#include <unordered_set>

namespace recompose::detail {

template <class T>
class SeenOnce {
 public:
  // True if `p` was not in the set (and is now).
  bool insert(T p) {
    if (!hashed_.empty()) return hashed_.insert(p).second;
    if (std::find(small_.begin(), small_.end(), p) != small_.end()) return false;
    small_.push_back(p);
    if (small_.size() > kLinear) hashed_.insert(small_.begin(), small_.end());
    return true;
  }

 private:
  static constexpr std::size_t kLinear = 32;
  c10::SmallVector<T, 8> small_;
  std::unordered_set<T> hashed_;
};

}  // namespace recompose::detail
