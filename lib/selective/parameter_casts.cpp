#include "parameter_casts.h"

#include "cache_entry.h"
#include "trace_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

namespace recompose::detail {

KeptCast::KeptCast(const at::Tensor& cast)
    : value(alias_of(cast)), bytes(static_cast<int64_t>(cast.storage().nbytes())) {}

void KeptCast::hold() {
  if (held) return;
  charge = MeterCharge(value);
  count_bytes_kept(bytes);
  held = true;
}

KeptCast::~KeptCast() {
  if (held) count_bytes_kept(-bytes);
}

int64_t KeptForReplay::cast_bytes() const {
  return std::accumulate(casts.begin(), casts.end(), int64_t{0});
}
int64_t KeptForReplay::draw_bytes() const {
  return std::accumulate(draws.begin(), draws.end(), int64_t{0});
}

std::vector<bool> casts_within(c10::ArrayRef<int64_t> bytes, int64_t room) {
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] < bytes[b]; });
  std::vector<bool> keep(bytes.size(), false);
  int64_t used = 0;
  for (const size_t i : order) {
    if (used + bytes[i] > room) break;  // the rest are larger
    used += bytes[i];
    keep[i] = true;
  }
  return keep;
}

int64_t cast_room(double budget, int64_t unchecked_bytes, int64_t draw_bytes) {
  if (!(budget > 0) || unchecked_bytes <= 0) return 0;
  const double room =
      std::floor(budget * static_cast<double>(unchecked_bytes)) - static_cast<double>(draw_bytes);
  if (room >= 9.0e18) return INT64_MAX;  // no limit to speak of
  return room > 0 ? static_cast<int64_t>(room) : 0;
}

}  // namespace recompose::detail
