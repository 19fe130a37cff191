// What the never-stall offload (OffloadOptions::never_stall) moves: per offloaded module, one
// decision per shape of what its calls save, fixed after a measured warm-up.
//
// Note [ Never-stall offload decides once ]
// Until issue 45 each call chose its copies from its own measured windows. On an H100 (runs 14
// and 15, 2026-11-26) those windows, measured on the host clock, changed from step to step, and
// so did what moved: steps that moved 252-279 MiB took 1.02-1.06x a plain step, steps that moved
// 471-499 MiB took 1.11-1.15x; the extra ~220 MiB cost about their link time, so a window that
// measured long in one step was not compute the copies got. So a module decides once:
//  1. Warm-up. Each call that saves tensors to copy has a shape: the bytes of those tensors, in
//     the order it saved them. The first OffloadOptions::warmup_calls (4) calls of a module with
//     one shape measure their windows (forward: the call's own forward time unless given;
//     backward: given, or twice the forward). The first three of them choose their copies by
//     their own windows, each call deciding for itself (moving nothing until the decision would
//     hold the device's peak at a plain step's for those steps). Why four: the first call of a
//     shape pays one-off costs (allocator growth, library handles, autotuning) and is the longest,
//     so it never decides; the shortest window of the three after it does. On the H100 long and
//     short windows came about equally often, so three samples all long happen about one time in
//     eight; a longer warm-up leaves more steps choosing per call (and `gpt`'s medians count
//     them).
//  2. The decision, at the warm-up's last call: from the link and the shortest forward and
//     backward windows measured, in saved order, each tensor goes while the running total's
//     copies fit both windows (fits_window, the rule of a warm-up call). Which positions go is
//     recorded for the module and shape, and from that call on every call of that shape moves
//     exactly those: the same bytes every step, and only bytes that every window measured hides.
//     Later windows are still measured and reported (OffloadStats::window_seconds) but change
//     nothing: a long one moves no more, and a short one less than the warm-up's shortest does
//     not undo it (deciding again from one window is the step-to-step choice this replaces).
//  3. A new shape (new input sizes, another sequence length): a call whose saved tensors differ
//     from every shape recorded starts a warm-up of its own; a decision is never applied to other
//     bytes. A module records up to kMaxShapes shapes, forgetting the least recently used beyond,
//     so a model whose shapes seldom repeat keeps choosing per call, as a warm-up call does.
//  4. Gradients and progress do not depend on the decision: it only picks which saved tensors
//     leave the device, each is unpacked from wherever it is, and a tensor backward asked for
//     before its copy started stays on the device whatever was decided (keep_last_on_device).
// The decisions live with the module's offload state (not reset by reset_offload_stats; gone
// with remove_offload); OffloadStats::warmup_calls and decisions count them.
#pragma once

#include <recompose/copy_link.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace recompose::detail {

// The never-stall limit of a call's copies: the compute they must fit in, each way.
struct CopyWindow {
  LinkModel link;
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// Which of the tensors of `bytes` (in saved order; 0: nothing to copy, skipped) go: each while
// the running total of those taken, copied out and back in as many copies, fits the window's
// forward and backward seconds.
std::vector<bool> fits_window(const std::vector<int64_t>& bytes, const CopyWindow& window);

// The decisions of one offloaded module. Thread-safe.
// See Note [ Never-stall offload decides once ].
class NeverStallPlan {
 public:
  static constexpr int64_t kMaxShapes = 8;

  explicit NeverStallPlan(int64_t warmup_calls);

  struct Choice {
    // Which positions of the call's saved tensors go; null while the shape warms up: the call
    // chooses by its own window.
    std::shared_ptr<const std::vector<bool>> moves;
    bool decided_now = false;  // this call completed the shape's warm-up
  };
  // The choice for a call that saved tensors of `saved_bytes` (the shape; empty: nothing to copy)
  // and measured `window`, which joins the warm-up's measurements while it lasts.
  Choice choose(const std::vector<int64_t>& saved_bytes, const CopyWindow& window);

 private:
  struct Shape {
    std::vector<int64_t> saved_bytes;
    int64_t calls = 0;  // windows measured
    double shortest_forward = 0, shortest_backward = 0;
    std::shared_ptr<const std::vector<bool>> moves;  // once decided
    uint64_t last_used = 0;
  };
  const int64_t warmup_calls_;
  std::mutex mutex_;
  std::vector<Shape> shapes_;
  uint64_t uses_ = 0;
};

}  // namespace recompose::detail
