// offload_report / total_offload_stats: what the offloaded modules of a tree moved, what stayed
// and why, and at what bandwidth (recompose/apply_offload.h).
#include <recompose/apply_offload.h>

#include <cstdio>
#include <sstream>
#include <string>

namespace recompose {
namespace {

void add(OffloadStats& into, const OffloadStats& s) {
  into.calls += s.calls;
  into.tensors_offloaded += s.tensors_offloaded;
  into.bytes_offloaded += s.bytes_offloaded;
  into.tensors_kept += s.tensors_kept;
  into.bytes_kept += s.bytes_kept;
  into.tensors_left_on_device += s.tensors_left_on_device;
  into.bytes_left_on_device += s.bytes_left_on_device;
  into.tensors_over_window += s.tensors_over_window;
  into.bytes_over_window += s.bytes_over_window;
  into.window_seconds += s.window_seconds;
  into.warmup_calls += s.warmup_calls;
  into.decisions += s.decisions;
  into.bytes_landed += s.bytes_landed;
  into.landing_seconds += s.landing_seconds;
}

std::string row(const std::string& name, const OffloadStats& s) {
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  char line[320];
  std::snprintf(
      line, sizeof line,
      "| %-20s | %5lld | %5lld %9.2f | %5lld %9.2f | %5lld %9.2f | %5lld %9.2f | %8.2f |\n",
      name.c_str(), static_cast<long long>(s.calls), static_cast<long long>(s.tensors_offloaded),
      mib(s.bytes_offloaded), static_cast<long long>(s.tensors_kept), mib(s.bytes_kept),
      static_cast<long long>(s.tensors_left_on_device), mib(s.bytes_left_on_device),
      static_cast<long long>(s.tensors_over_window), mib(s.bytes_over_window),
      s.achieved_bytes_per_second() / 1e9);
  return line;
}

}  // namespace

OffloadStats total_offload_stats(const torch::nn::Module& root) {
  OffloadStats total;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (is_offloaded(*item.value())) add(total, offload_stats(*item.value()));
  }
  return total;
}

std::string offload_report(const torch::nn::Module& root) {
  std::ostringstream s;
  s << "tensors and MiB; kept (rule): not eligible (parameters, below min_bytes) or kept by the "
       "policy; kept (last):\n"
    << "the last call's, asked for before they left; kept (window): their copies would not fit the "
       "window\n"
    << "| module               | calls | offloaded (MiB) | kept (rule)     | kept (last)     | "
       "kept (window)   |   GB/s   |\n"
    << "|----------------------|-------|-----------------|-----------------|-----------------|-----"
       "------------|----------|\n";
  OffloadStats total;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    if (!is_offloaded(*item.value())) continue;
    const OffloadStats st = offload_stats(*item.value());
    add(total, st);
    s << row(item.key().empty() ? "(root)" : item.key(), st);
  }
  s << row("total", total);
  if (total.window_seconds > 0) {  // never-stall calls were made
    // See Note [ Never-stall offload decides once ].
    s << "never-stall: " << total.warmup_calls << " of " << total.calls
      << " calls chose by their own windows (warm-up), " << total.decisions
      << " decisions fixed what later calls move (one per module and shape of saved tensors)\n";
  }
  return s.str();
}

}  // namespace recompose
