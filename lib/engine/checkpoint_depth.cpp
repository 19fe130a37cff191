#include "engine/checkpoint_depth.h"

namespace recompose::detail {

int& CheckpointDepth::forward() {
  thread_local int depth = 0;
  return depth;
}
int& CheckpointDepth::recompute() {
  thread_local int depth = 0;
  return depth;
}

}  // namespace recompose::detail
