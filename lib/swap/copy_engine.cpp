#include "swap/copy_engine.h"

#include <c10/core/StreamGuard.h>

#include <chrono>
#include <vector>

namespace recompose::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

c10::Stream CopyEngine::stream_for(const c10::Device& device) {
  std::lock_guard lock(mutex_);
  auto it = streams_.find(device);
  if (it == streams_.end()) it = streams_.emplace(device, side_stream(device)).first;
  return it->second;
}

CopyEngine::Launched CopyEngine::launch(const c10::Device& device, bool pinned,
                                        bool after_current_work,
                                        c10::function_ref<void(bool, const c10::Stream*)> copy) {
  Launched launched;
  const auto start = Clock::now();
  if (uses_streams(device)) {
    const c10::Stream stream = stream_for(device);
    if (after_current_work) CopyFence::record(current_stream(device))->block(stream);
    {
      c10::StreamGuard on_copy(stream);
      copy(/*non_blocking=*/pinned, &stream);
    }
    launched.fence = CopyFence::record(stream);
  } else {
    copy(/*non_blocking=*/false, nullptr);
    launched.fence = std::make_shared<CopyFence>();
  }
  // Pinned copies are queued, not waited for; every other copy ran to its end on the host.
  if (!pinned) launched.host_seconds = seconds_since(start);
  return launched;
}

std::optional<c10::Stream> CopyEngine::hand_over(const CopyFence& fence,
                                                 const c10::Device& device) {
  if (!uses_streams(device)) return std::nullopt;
  const c10::Stream consumer = current_stream(device);
  fence.block(consumer);
  return consumer;
}

double CopyEngine::synchronize() {
  std::vector<c10::Stream> streams;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [device, stream] : streams_) streams.push_back(stream);
  }
  const auto start = Clock::now();
  for (const auto& stream : streams) synchronize_stream(stream);
  return seconds_since(start);
}

}  // namespace recompose::detail
