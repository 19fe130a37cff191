// PyTorch's `context_fn`: a pair of contexts, one entered around a checkpointed region's forward,
// one around each of its recomputations. Selective activation checkpointing is built on it.
#pragma once

#include <functional>
#include <memory>

namespace recompose {

// One object per invocation of a region. enter_*() returns a token; the context is left when
// the token is destroyed. Tokens are entered and left on one thread, innermost first.
class RegionContexts {
 public:
  virtual ~RegionContexts() = default;
  [[nodiscard]] virtual std::shared_ptr<void> enter_forward() = 0;
  [[nodiscard]] virtual std::shared_ptr<void> enter_recompute() = 0;
};

// Makes the contexts of one region invocation (called once per forward of the region).
using ContextFn = std::function<std::shared_ptr<RegionContexts>()>;

}  // namespace recompose
