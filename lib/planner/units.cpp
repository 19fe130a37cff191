#include "units.h"

#include <cstdio>

namespace recompose::detail {

std::string format_mib(int64_t bytes, bool exact) {
  char buffer[64];
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (exact) {
    std::snprintf(buffer, sizeof buffer, "%.2f MiB (%lld bytes)", mib,
                  static_cast<long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2f MiB", mib);
  }
  return buffer;
}

}  // namespace recompose::detail
