// A one-line progress bar redrawn with '\r' on a terminal; elsewhere (logs, meson test) it
// prints a plain line every tenth of the run so the output stays readable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpt {

std::string format_bytes(int64_t bytes);

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::FILE* stream = stdout);
  void update(int64_t done, const std::string& status);
  void finish();  // ends the line

 private:
  std::string label_;
  int64_t total_;
  std::FILE* stream_;
  bool terminal_;
  bool open_ = false;
};

}  // namespace gpt
