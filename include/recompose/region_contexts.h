// PyTorch's `context_fn`: a pair of contexts, one entered around a checkpointed region's forward,
// one around each of its recomputations. Selective activation checkpointing is built on it.
#pragma once

#include <functional>
#include <memory>

namespace recompose {

/// One object per invocation of a region. enter_*() returns a token; the context is left when
/// the token is destroyed. Tokens are entered and left on one thread, innermost first.
///
/// Example: a context that counts recomputations
/// ```
/// struct CountRecomputes : recompose::RegionContexts {
///   std::shared_ptr<int> count;
///   std::shared_ptr<void> enter_forward() override { return nullptr; }
///   std::shared_ptr<void> enter_recompute() override { ++*count; return nullptr; }
/// };
/// auto count = std::make_shared<int>(0);
/// auto y = recompose::checkpoint(recompose::CheckpointOptions().context_fn([count] {
///   auto c = std::make_shared<CountRecomputes>();
///   c->count = count;
///   return c;
/// }), fn, x);
/// ```
class RegionContexts {
 public:
  virtual ~RegionContexts() = default;
  /// Enters the context around the region's forward; left when the token is destroyed.
  [[nodiscard]] virtual std::shared_ptr<void> enter_forward() = 0;
  /// Enters the context around one recomputation of the region; left when the token is destroyed.
  [[nodiscard]] virtual std::shared_ptr<void> enter_recompute() = 0;
};

/// Makes the contexts of one region invocation (called once per forward of the region): the
/// type of CheckpointOptions::context_fn.
using ContextFn = std::function<std::shared_ptr<RegionContexts>()>;

}  // namespace recompose
