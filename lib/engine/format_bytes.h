// Bytes as recompose's reports and warnings print them ("12 B", "3.5 KiB",
// "1.25 MiB").
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

}  // namespace recompose::detail
