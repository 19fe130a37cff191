// Bytes as recompose writes them for people: warnings and reports in the unit that fits
// (format_bytes), the planner's tables, profiles and errors in MiB (format_mib).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace recompose::detail {

inline std::string format_bytes(int64_t bytes) {
  char buffer[32];
  if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(buffer, sizeof buffer, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buffer, sizeof buffer, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
  }
  return buffer;
}

// "12.50 MiB"; with `exact`, "12.50 MiB (13107200 bytes)" (error messages, where the exact figure
// matters).
inline std::string format_mib(int64_t bytes, bool exact = false) {
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
