// Command-line flags of the gpt example.
#pragma once

#include "policies.h"

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

struct Options {
  Policy policy = Policy::None;
  bool compare = false;
  // --policies: the policies --compare trains (none first, added when not named); default all.
  std::vector<Policy> policies{kAllPolicies.begin(), kAllPolicies.end()};
  std::string budget;  // --budget: plan for this many bytes held for backward ("40%", "12MiB")
  std::filesystem::path plan;    // --plan: apply this saved plan (JSON) instead of a policy
  bool sweep = false;            // --sweep: the planner's curve beside the fixed policies
  bool sweep_peak = false;       // --sweep-peak: the sweep's budgets are peaks of device memory
  std::string link = "measure";  // --link: the device <-> host link (offload_link.h)
  double offload_window_ms =
      0;                       // --offload-window-ms: offload-window's forward window (0: measured)
  double memory_fraction = 0;  // --memory-fraction: cap of the CUDA caching allocator (0: none)
  std::string device = "auto";
  bool bf16 = false;          // --bf16: CUDA autocast to bfloat16 for the forward
  bool phase_times = false;   // --phase-times: forward and backward timed apart
  int64_t profile_steps = 0;  // --profile N: the last N steps under the Kineto profiler
  bool ledger = false;        // --ledger: every step under a StepLedger; the last one printed
  bool no_meter = false;      // --no-meter: bytes held for backward not counted  // auto: CUDA when
                              // available, else CPU
  int64_t steps = 300;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 64;
  int64_t batch = 16;
  double lr = 3e-3;
  double dropout = 0.1;
  uint64_t seed = 1337;
  // One CPU thread by default: on a shared 2-core machine LibTorch's OpenMP threads spin while
  // a core is busy elsewhere, and a step takes ten times longer than with one thread.
  int64_t threads = 1;
  int64_t sample = 200;  // characters generated at the end; 0 turns it off
  std::filesystem::path data;
  std::filesystem::path out = "gpt_out";
  std::filesystem::path save_initial_state;  // empty: not written (see initial_state.h)
  bool help = false;
};

// A flag that is unknown, lacks its value or has a bad one.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Options parse_options(int argc, char** argv);
std::string usage(const char* program);

}  // namespace gpt
