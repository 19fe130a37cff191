// The module state a region's forward ran with, put back around its recomputation.
//
// A recomputation re-runs the forward of the region's modules. Without care it would update
// their buffers a second time (BatchNorm's running statistics, a user's step counter or EMA)
// and run in whatever train/eval mode the modules are in at backward time. The snapshot
// records, at the region's entry, every module's mode and a copy of every buffer of the
// region's module trees; after the forward it keeps only the copies of the buffers the forward
// wrote (their version counter moved, or, for floating-point buffers, their value changed: some
// kernels such as BatchNorm's write running statistics without moving it). Around the recomputation each such buffer is pointed at
// a fresh copy of its entry value (set_, so tensors that alias the live storage are not
// touched) and pointed back at its live storage afterwards; the modes are set to the forward's
// and restored.
#pragma once

#include <ATen/core/Tensor.h>
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

  // Drops the copies of the buffers that the forward did not write.
  void forward_done();

  bool empty() const { return modes_.empty() && buffers_.empty(); }

  // Puts the entry state in place while alive; restores the live state after.
  class RecomputeScope {
   public:
    explicit RecomputeScope(const ModuleStateSnapshot* snapshot);
    ~RecomputeScope();
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

   private:
    struct LiveBuffer {
      at::Tensor buffer;  // the module's tensor (its TensorImpl is shared with the module)
      at::Tensor live;    // an alias of its live storage
    };
    std::vector<LiveBuffer> buffers_;
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
  };

 private:
  struct BufferEntry {
    at::Tensor buffer;
    at::Tensor at_entry;  // a copy of the value at the region's entry
    int64_t version;
  };
  // Pre-order (parents before children), so that train(bool), which recurses, can be replayed.
  // Inline for small regions: the snapshot lives in the frame and then allocates nothing.
  c10::SmallVector<std::pair<std::shared_ptr<torch::nn::Module>, bool>, 4> modes_;
  std::vector<BufferEntry> buffers_;
};

}  // namespace recompose::detail
