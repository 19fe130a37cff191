// The module state a region's forward ran with, put back around its recomputation.
//
// A recomputation re-runs the forward of the region's modules. Without care it would update
// their buffers a second time (BatchNorm's running statistics, a user's step counter or EMA)
// and run in whatever train/eval mode the modules are in at backward time. The snapshot
// records, at the region's entry, every module's mode and a copy of every buffer of the
// region's module trees.
//
// Every buffer is put back, written or not. Whether the forward wrote a buffer cannot be told
// cheaply: kernels such as BatchNorm's write running statistics without moving the version
// counter (their schemas do not mark them as written), and a write may leave the value as it
// was (a batch mean equal to the running mean) while a later call of the same module, before
// the backward, moves it. The entry copy is needed anyway; putting it in place is a few pointer
// swaps per buffer.
//
// Around the recomputation each buffer's TensorImpl is pointed at a fresh copy of its entry
// value, with a version counter of its own, and pointed back at its live storage and counter
// afterwards. Neither moves the live version counter: a tensor that autograd saved outside the
// region (the same BatchNorm called outside it, a double-backward graph) passes its version
// check, and tensors that alias the live storage are not touched. The modes are set to the
// forward's and restored.
//
// Pointing a module's TensorImpl elsewhere is visible to every thread that uses the module, so
// the copies at entry and the recomputation's swap lock the state they touch, per buffer and
// module (See Note [ Module state locks ]): two threads that recompute, or enter regions over,
// the same modules at once see whole buffers (tests/apply_checkpoint_test.cpp, "several
// threads"); threads over different modules recompute at once (tests/module_state_test.cpp,
// "four threads"). Locks are taken only where a snapshot holds buffers or modes to change. Code
// of the user's that reads a buffer on another thread during a recomputation is not covered
// (LibTorch modules are not thread-safe for that).
#pragma once

#include "engine/module_modes.h"
#include "engine/module_state_locks.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::detail {

class ModuleStateSnapshot {
 public:
  // Records the modes and buffers of `roots`, of `also` (when not null) and of all their
  // descendants (each once).
  explicit ModuleStateSnapshot(const std::vector<std::shared_ptr<torch::nn::Module>>& roots,
                               const std::shared_ptr<torch::nn::Module>& also = nullptr);

  bool empty() const { return modes_.empty() && buffers_.empty(); }

  // Puts the entry state in place while alive; restores the live state after.
  class RecomputeScope {
   public:
    explicit RecomputeScope(const ModuleStateSnapshot* snapshot);
    ~RecomputeScope();
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

   private:
    void put_entry_values(const ModuleStateSnapshot& snapshot);
    ModuleStateLocks locks_;  // released after restore(): destroyed last
    void restore();
    // What the module's TensorImpl held before the recomputation, put back after it.
    struct LiveBuffer {
      at::Tensor buffer;  // the module's tensor (its TensorImpl is shared with the module)
      at::Storage storage;
      c10::SmallVector<int64_t, 4> sizes, strides;
      int64_t storage_offset;
      c10::VariableVersion version;
    };
    std::vector<LiveBuffer> buffers_;
    ModuleModes modes_;  // the live modes, when the forward's differed
  };

 private:
  struct BufferEntry {
    at::Tensor buffer;
    at::Tensor at_entry;  // a copy of the value at the region's entry
    uint32_t version;     // its version at the region's entry
  };
  ModuleModes modes_;  // at the region's entry

  std::vector<BufferEntry> buffers_;
};

}  // namespace recompose::detail
