// Measures the bytes that autograd holds for backward: every tensor saved while a meter is
// alive is accounted until autograd releases it (after backward, or when the graph dies).
// Tensors saved inside checkpointed regions cost nothing (only a placeholder is saved); the
// inputs of a region are counted, and so are the op outputs that selective checkpointing keeps
// on the device (from when they are kept until they are replayed or dropped). Leaves that require
// grad (parameters, and inputs marked requires_grad) and views of them are not counted: they are
// held whether or not backward runs.
//
//   recompose::SavedTensorMeter meter;
//   auto loss = model(x).sum();
//   std::cout << meter.bytes_held() << " bytes held for backward\n";
//   loss.backward();                     // meter.bytes_held() falls back to 0
//
// A meter is a saved-tensor scope, like AsyncSaveOnCpu and checkpointed regions: destroy it on
// the thread that created it, in LIFO order with the other scopes. A meter destroyed out of
// order, or on another thread, is closed all the same (nothing dangles), and the next recompose
// call on the thread that created it (a saved tensor, a new scope) throws
// recompose::CheckpointError naming the misuse.
#pragma once

#include <cstdint>
#include <memory>

namespace at {
class Tensor;
}

namespace recompose {

/// RAII: counts the bytes autograd holds for the tensors saved on this thread while it is alive
/// (see the header comment). While it is alive, a saved tensor modified in place before backward
/// unpacks it makes backward throw CheckpointError (LibTorch's own version check is skipped for
/// hooked saved tensors; the meter does it).
///
/// Example:
/// ```
/// recompose::SavedTensorMeter meter;
/// auto loss = model(x).sum();
/// std::cout << meter.peak_bytes_held() << " bytes held for backward at most\n";
/// ```
class SavedTensorMeter {
 public:
  /// Starts counting tensors saved on this thread, outside of checkpointed regions. Throws
  /// CheckpointError if a misuse of this thread's saved-tensor scopes is pending.
  SavedTensorMeter();
  ~SavedTensorMeter();
  SavedTensorMeter(const SavedTensorMeter&) = delete;
  SavedTensorMeter& operator=(const SavedTensorMeter&) = delete;

  /// Bytes of the distinct storages currently held by tensors saved under this meter.
  int64_t bytes_held() const;
  /// Highest value bytes_held() reached.
  int64_t peak_bytes_held() const;
  /// Number of saved tensors currently held.
  int64_t tensors_held() const;
  /// Whether the storage of `tensor` is currently held by a tensor saved under this meter (false
  /// for an undefined tensor).
  /// Example: `bool kept = meter.holds(hidden);   // does backward still hold hidden's memory?`
  bool holds(const at::Tensor& tensor) const;

  struct Counters;

 private:
  struct Scope;
  std::shared_ptr<Counters> counters_;
  std::unique_ptr<Scope> scope_;
};

}  // namespace recompose
