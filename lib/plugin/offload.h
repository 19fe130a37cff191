// The interface through which a plug-in moves a tensor out of device memory and back, without
// knowing who does it: selective checkpointing's MUST_SWAP offloads the outputs it keeps through
// an Offloader. Activation swap (lib/swap) provides it when it is built; without it,
// make_offloader() throws CheckpointError.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

namespace recompose {
class SwapManager;  // recompose/swap.h
}

namespace recompose::detail {

// One offloaded tensor; dropping the last reference frees the host copy.
class OffloadedTensor {
 public:
  virtual ~OffloadedTensor() = default;
  // The tensor back on its device (waits for, or launches, the reload).
  virtual at::Tensor get() = 0;
};

class Offloader {
 public:
  virtual ~Offloader() = default;
  // Whether `tensor` is worth offloading (small tensors, parameters... stay).
  virtual bool eligible(const at::Tensor& tensor) const = 0;
  virtual std::shared_ptr<OffloadedTensor> offload(const at::Tensor& tensor) = 0;
  // Waits until every copy in flight has landed.
  virtual void synchronize() = 0;
};

// Makes the Offloader of `manager` (the process's default manager when null).
using OffloaderFactory = std::shared_ptr<Offloader> (*)(std::shared_ptr<SwapManager> manager);

// Called by the provider's registration function (lib/swap).
void set_offloader_factory(OffloaderFactory factory);

// Throws CheckpointError when this build has no provider (configured with -Dswap=disabled).
std::shared_ptr<Offloader> make_offloader(std::shared_ptr<SwapManager> manager);

}  // namespace recompose::detail
