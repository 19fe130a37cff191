// Budget: bytes, or a fraction of the profile's no-checkpointing figure.
#include <recompose/planner.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace recompose {

Budget Budget::bytes(int64_t bytes) {
  if (bytes <= 0)
    throw std::invalid_argument("recompose: Budget::bytes: the budget must be positive, got " +
                                std::to_string(bytes));
  return Budget(bytes, 0);
}

Budget Budget::fraction(double fraction) {
  if (!(fraction > 0) || !std::isfinite(fraction)) {
    throw std::invalid_argument(
        "recompose: Budget::fraction: the fraction must be positive and finite, got " +
        std::to_string(fraction));
  }
  return Budget(0, fraction);
}

Budget Budget::peak_bytes(int64_t bytes) {
  if (bytes <= 0) {
    throw std::invalid_argument("recompose: Budget::peak_bytes: the peak must be positive, got " +
                                std::to_string(bytes));
  }
  return Budget(bytes, 0, true);
}

Budget Budget::parse(std::string_view text) {
  if (text.starts_with("peak=")) {
    const Budget b = parse(text.substr(5));
    if (b.is_fraction()) {
      throw std::invalid_argument("recompose: Budget::parse: '" + std::string(text) +
                                  "': a peak is bytes (\"peak=20GiB\"), not a percentage");
    }
    return peak_bytes(b.bytes_);
  }
  const std::string t(text);
  auto bad = [&](const std::string& why) {
    return std::invalid_argument(
        "recompose: Budget::parse: '" + t + "' " + why +
        " (write a percentage of the no-checkpointing bytes, \"40%\", or bytes: "
        "\"123456\", \"12.5MiB\", \"3GiB\", \"64MB\"; or a device peak: \"peak=20GiB\")");
  };
  char* end = nullptr;
  const double value = std::strtod(t.c_str(), &end);
  if (end == t.c_str()) throw bad("is not a number");
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  if (!(value > 0) || !std::isfinite(value)) throw bad("is not positive");
  if (unit == "%") return fraction(value / 100.0);
  // "50" is far more likely a percentage without its '%' than a budget of 50 bytes.
  if (unit.empty() && value <= 100) {
    throw bad("reads as " + t + " bytes, which no model fits in; for a percentage write \"" + t +
              "%\", for bytes \"" + t + "B\"");
  }
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1024.0 * 1024},
                                                          {"GiB", 1024.0 * 1024 * 1024},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double b = value * scale;
    if (scale == 1 && b != std::floor(b)) throw bad("is a fraction of a byte");
    if (b < 1 || b > 9e18) throw bad("is out of range");
    return bytes(static_cast<int64_t>(std::llround(b)));
  }
  throw bad("has an unknown unit '" + unit + "'");
}

int64_t Budget::resolve(const MemoryProfile& profile) const {
  if (fraction_ > 0)
    return static_cast<int64_t>(std::llround(fraction_ * static_cast<double>(profile.bytes_held)));
  if (peak_) return bytes_ - profile.resident_bytes;
  return bytes_;
}

}  // namespace recompose
