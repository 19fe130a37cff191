// Recompute at most once across several backward calls (PyTorch 2.10's
// torch.utils.checkpoint.GraphExecGroup): every checkpointed region that backward calls made on
// this thread while the group is alive need is recomputed once, by the first of them, and the
// later calls use what it recomputed. For split input/weight gradients and pipeline schedules,
// where one loss is backpropagated in several calls.
//
//   auto [a, b] = model(x);                            // a checkpointed region with two outputs
//   {
//     recompose::GraphExecGroup group;
//     a.sum().backward();                               // recomputes the region once
//     b.sum().backward();                               // uses the same recomputation
//   }
//
// Rules (as in PyTorch): the backward calls of one group must use disjoint saved tensors of a
// region (a saved tensor is handed out once per recomputation); a second use throws
// CheckpointError saying so. Groups do not nest. Backward calls made on other threads are not
// in the group; backward work that LibTorch runs on its device threads for a call made on this
// thread is. Without a group each backward call recomputes what it needs (PyTorch's default).
#pragma once

#include <cstdint>

namespace recompose {

/// RAII: while alive, the backward calls made on this thread recompute each checkpointed region
/// at most once (see the header comment for the rules).
///
/// Example:
/// ```
/// auto [a, b] = model(x);
/// {
///   recompose::GraphExecGroup group;
///   a.sum().backward();   // recomputes the region once
///   b.sum().backward();   // uses the same recomputation
/// }
/// ```
class GraphExecGroup {
 public:
  /// Opens a group on this thread. Throws CheckpointError if one is already open on it.
  GraphExecGroup();
  /// Closes it: later backward calls recompute again.
  ~GraphExecGroup();
  GraphExecGroup(const GraphExecGroup&) = delete;
  GraphExecGroup& operator=(const GraphExecGroup&) = delete;

  /// The key under which this group's recomputations are kept (distinct from every graph task
  /// id).
  int64_t key() const { return key_; }

 private:
  int64_t key_;
};

}  // namespace recompose
