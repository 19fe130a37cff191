// The copies between device and host memory of one SwapManager: a side stream per device,
// asynchronous when the host side is pinned, synchronous on devices without streams (CPU).
// Thread-safe; its mutex is a leaf (held only to find a device's stream, never during a copy).
// See Note [ Swap copies ].
#pragma once

#include "swap/copy_fence.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/FunctionRef.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace recompose::detail {

class CopyEngine {
 public:
  struct Launched {
    std::shared_ptr<CopyFence> fence;  // complete when the copy has landed
    double host_seconds = 0;           // time the host waited for a synchronous copy
  };
  // Runs `copy(non_blocking, copy_stream)` on the copy stream of `device` (copy_stream null and
  // the copy synchronous on a device without streams). `after_current_work`: the copy stream
  // first waits for the work queued so far on the current stream (the producer of an offload's
  // source). `pinned`: the host side is page-locked, so the copy may run asynchronously.
  //   engine.launch(device, pinned, true, [&](bool non_blocking, const c10::Stream* stream) {
  //     host.copy_(source, non_blocking);
  //   });
  Launched launch(const c10::Device& device, bool pinned, bool after_current_work,
                  c10::function_ref<void(bool non_blocking, const c10::Stream* copy_stream)> copy);
  // Hands the result of the copy behind `fence` to the current stream of `device`: that stream
  // waits for the copy on the device (the host does not). Returns that stream, which the caller
  // must keep the result alive for (DeferredRelease: nothing is record_stream'ed); nothing on
  // devices without streams.
  std::optional<c10::Stream> hand_over(const CopyFence& fence, const c10::Device& device);
  // Waits on the host for every copy launched so far; returns the time waited.
  double synchronize();

 private:
  c10::Stream stream_for(const c10::Device& device);

  std::mutex mutex_;
  std::unordered_map<c10::Device, c10::Stream> streams_;
};

}  // namespace recompose::detail
