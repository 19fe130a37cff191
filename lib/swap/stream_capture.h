// Whether a stream is being captured into a CUDA graph: swap's copies cannot run there (their
// completion is observed by the host, which a captured graph never tells), so swap refuses them
// with a CheckpointError and defers its polling. See Note [ Swap copies and graph capture ].
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <string_view>

namespace recompose::detail {

// True while `stream` is being captured (or its capture status cannot be read, which CUDA reports
// for the legacy default stream while another stream captures). False off CUDA and in builds
// without CUDA.
bool is_capturing(const c10::Stream& stream);

// Whether swap may query and record events for tensors of `device` on this thread now: not while
// the thread's current stream of `device` is being captured.
bool may_poll(const c10::Device& device);

// Throws CheckpointError, naming `call` and saying what to do instead, if the current stream of
// `device` is being captured.
void refuse_under_capture(const c10::Device& device, std::string_view call);

}  // namespace recompose::detail
