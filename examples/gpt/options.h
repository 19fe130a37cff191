// Command-line flags of the gpt example.
#pragma once

#include "policies.h"

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace gpt {

struct Options {
  Policy policy = Policy::None;
  bool compare = false;
  std::string device = "auto";  // auto: CUDA when available, else CPU
  int64_t steps = 150;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 64;
  int64_t batch = 16;
  double lr = 3e-3;
  double dropout = 0.1;
  uint64_t seed = 1337;
  int64_t sample = 200;  // characters generated at the end; 0 turns it off
  std::filesystem::path data;
  std::filesystem::path out = "gpt_out";
  bool help = false;
};

// A flag that is unknown, lacks its value or has a bad one.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Options parse_options(int argc, char** argv);
std::string usage(const char* program);

}  // namespace gpt
