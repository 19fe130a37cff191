#include "block_offload.h"

#include <recompose/apply_offload.h>

#include <cstdio>

namespace sharded {

std::shared_ptr<recompose::SwapManager> offload_blocks(MlpModel& model) {
  // measure_waits: a reload that is late stalls the host, and its time is counted, so the
  // report shows what offload cost the step.
  auto manager =
      recompose::SwapManager::create(recompose::SwapOptions().min_bytes(0).measure_waits(true));
  for (const auto& b : *model->blocks)
    recompose::apply_offload(*b, recompose::OffloadOptions().manager(manager));
  return manager;
}

void print_offload(const MlpModel& model, const recompose::SwapManager& manager,
                   const CollectiveCounts& counts) {
  const recompose::OffloadStats o = recompose::total_offload_stats(*model);
  const recompose::SwapStats s = manager.stats();
  const bool cpu = model->parameters().front().device().is_cpu();
  std::printf("offload on each rank (apply_offload on the %zu blocks, one manager%s):\n",
              model->blocks->size(), cpu ? "; CPU: host-to-host copies that save nothing" : "");
  std::printf("  to host   %lld tensors, %.2f MB; landed in %.4f s (%.2f GB/s%s)\n",
              (long long)o.tensors_offloaded, o.bytes_offloaded / 1e6, o.landing_seconds,
              o.achieved_bytes_per_second() / 1e9,
              cpu ? "" : "; on a GPU an upper bound on the copies' time");
  std::printf("  back      %lld tensors, %.2f MB (%lld prefetched, %lld on demand)\n",
              (long long)s.tensors_reloaded, s.bytes_reloaded / 1e6, (long long)s.prefetched,
              (long long)s.sync_loads);
  std::printf(
      "  stayed    %lld tensors, %.2f MB (not eligible: parameters and views; "
      "the last block's until backward: %lld)\n",
      (long long)(o.tensors_kept + o.tensors_left_on_device),
      (o.bytes_kept + o.bytes_left_on_device) / 1e6, (long long)o.tensors_left_on_device);
  std::printf(
      "  host waited %.4f s for copies (%s)\n", s.wait_seconds,
      cpu ? "every copy: they are synchronous on the CPU" : "late reloads and offloads held back");
  const double copies = cpu ? s.wait_seconds : o.landing_seconds;
  std::printf(
      "  against the collectives: %.4f s for %.2f MB; the offload copies' %.4f s are "
      "%.1f%% of that\n",
      counts.seconds, counts.bytes / 1e6, copies,
      counts.seconds > 0 ? 100 * copies / counts.seconds : 0.0);
  std::fflush(stdout);
}

}  // namespace sharded
