#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace gpt {

std::string format_bytes(int64_t bytes) {
  static constexpr std::array<const char*, 4> units = {"B", "KiB", "MiB", "GiB"};
  auto value = static_cast<double>(bytes);
  size_t unit = 0;
  while (std::abs(value) >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buffer;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* stream)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      stream_(stream),
      terminal_(isatty(fileno(stream)) != 0) {}

void ProgressBar::update(int64_t done, const std::string& status) {
  if (terminal_) {
    constexpr int64_t width = 24;
    const int64_t filled = width * done / total_;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
    // \x1b[K clears what a longer previous line left behind.
    std::fprintf(stream_, "\r%s [%s] %lld/%lld %s\x1b[K", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), status.c_str());
    open_ = true;
  } else {
    const int64_t every = std::max<int64_t>(total_ / 10, 1);
    if (done % every != 0 && done != total_ && done != 1) return;
    std::fprintf(stream_, "%s %lld/%lld %s\n", label_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), status.c_str());
  }
  std::fflush(stream_);
}

void ProgressBar::finish() {
  if (open_) std::fputc('\n', stream_);
  open_ = false;
  std::fflush(stream_);
}

}  // namespace gpt
