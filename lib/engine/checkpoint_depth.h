// Where this thread is: inside how many checkpointed forwards and recomputations
// (behind is_checkpointing() / is_recomputing()).
#pragma once

namespace recompose::detail {

// Thread-local depth counters.
struct CheckpointDepth {
  static int& forward();
  static int& recompute();
};

// Increments a CheckpointDepth counter while alive.
struct DepthGuard {
  explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
  int& depth_;
};

}  // namespace recompose::detail
