#include "swap/never_stall_plan.h"

#include <algorithm>
#include <stdexcept>

namespace recompose::detail {

std::vector<bool> fits_window(const std::vector<int64_t>& bytes, const CopyWindow& window) {
  std::vector<bool> goes(bytes.size(), false);
  int64_t total = 0, copies = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int64_t b = bytes[i];
    if (b <= 0) continue;
    if (window.link.d2h_seconds(total + b, copies + 1) <= window.forward_seconds &&
        window.link.h2d_seconds(total + b, copies + 1) <= window.backward_seconds) {
      total += b, copies += 1;
      goes[i] = true;
    }
  }
  return goes;
}

NeverStallPlan::NeverStallPlan(int64_t warmup_calls) : warmup_calls_(warmup_calls) {
  if (warmup_calls < 1) throw std::invalid_argument("NeverStallPlan: warmup_calls must be >= 1");
}

// See Note [ Never-stall offload decides once ].
NeverStallPlan::Choice NeverStallPlan::choose(const std::vector<int64_t>& saved_bytes,
                                              const CopyWindow& window) {
  if (saved_bytes.empty()) return {std::make_shared<const std::vector<bool>>(), false};
  std::lock_guard lock(mutex_);
  auto it = std::find_if(shapes_.begin(), shapes_.end(),
                         [&](const Shape& s) { return s.saved_bytes == saved_bytes; });
  if (it == shapes_.end()) {
    if (static_cast<int64_t>(shapes_.size()) >= kMaxShapes) {
      shapes_.erase(std::min_element(
          shapes_.begin(), shapes_.end(),
          [](const Shape& a, const Shape& b) { return a.last_used < b.last_used; }));
    }
    shapes_.push_back(
        Shape{saved_bytes, 0, window.forward_seconds, window.backward_seconds, nullptr, 0});
    it = std::prev(shapes_.end());
  }
  Shape& shape = *it;
  shape.last_used = ++uses_;
  if (shape.moves) return {shape.moves, false};
  shape.calls += 1;
  shape.shortest_forward = std::min(shape.shortest_forward, window.forward_seconds);
  shape.shortest_backward = std::min(shape.shortest_backward, window.backward_seconds);
  if (shape.calls < warmup_calls_) return {nullptr, false};
  shape.moves = std::make_shared<const std::vector<bool>>(fits_window(
      saved_bytes, CopyWindow{window.link, shape.shortest_forward, shape.shortest_backward}));
  return {shape.moves, true};
}

}  // namespace recompose::detail
