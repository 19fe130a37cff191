// Helpers shared by the selective checkpointing tests.
#pragma once

#include <recompose/selective_checkpoint.h>

namespace rt {

// A policy that gives `p` for every op.
inline recompose::SelectivePolicy always(recompose::CheckpointPolicy p) {
  return recompose::SelectivePolicy([p](const recompose::SelectiveCheckpointContext&,
                                        const c10::OperatorHandle&,
                                        const torch::jit::Stack&) { return p; });
}

// Switches the selective replay on or off while alive; puts back the setting it found.
struct ReplaySwitch {
  bool was = recompose::selective_replay_enabled();
  explicit ReplaySwitch(bool on) { recompose::set_selective_replay_enabled(on); }
  ~ReplaySwitch() { recompose::set_selective_replay_enabled(was); }
  ReplaySwitch(const ReplaySwitch&) = delete;
  ReplaySwitch& operator=(const ReplaySwitch&) = delete;
};

}  // namespace rt
