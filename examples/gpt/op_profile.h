// --profile: a few training steps under LibTorch's Kineto profiler (host ops; device kernels,
// copies and synchronisations on CUDA), to see where a policy's time goes (issue 25). Writes a
// Chrome trace and prints, per phase of the step (gpt::forward, gpt::backward, the selective
// replays inside backward: recompose::selective_replay), the top-level ops with their host time,
// the device time of the kernels launched, and the synchronisations and allocations seen.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

namespace gpt {

class OpProfile {
 public:
  // Starts profiling host ops, and CUDA activity when `cuda`.
  explicit OpProfile(bool cuda);
  ~OpProfile();  // stops profiling if finish() was not called
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Stops profiling, writes the Chrome trace to `trace` and returns the summary (printable).
  std::string finish(const std::filesystem::path& trace, const std::string& title);

 private:
  bool active_ = false;
};

}  // namespace gpt
