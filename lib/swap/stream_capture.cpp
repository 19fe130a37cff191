#include "swap/stream_capture.h"

#include "engine/device_adapter.h"

#include <recompose/checkpoint_error.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <string>

namespace recompose::detail {

bool is_capturing(const c10::Stream& stream) {
#ifdef RECOMPOSE_WITH_CUDA
  if (stream.device_type() != c10::DeviceType::CUDA) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err =
      C10_CUDA_ERROR_HANDLED(cudaStreamIsCapturing(c10::cuda::CUDAStream(stream), &status));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it so that the next CUDA call does not see it
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

bool may_poll(const c10::Device& device) {
  return !uses_streams(device) || !is_capturing(current_stream(device));
}

void refuse_under_capture(const c10::Device& device, std::string_view call) {
  if (may_poll(device)) return;
  throw CheckpointError(
      "recompose: " + std::string(call) +
      ": the current stream is being captured into a CUDA graph, and swap cannot copy to or from "
      "host memory inside a capture (the host learns when a copy lands, and frees device memory "
      "then; a captured graph tells the host nothing). Keep swap out of the captured region: run "
      "the swapped forward and its backward outside the capture, or capture code that swaps "
      "nothing (AsyncSaveOnCpu, apply_offload, swap_inputs and MUST_SWAP all swap).");
}

}  // namespace recompose::detail
