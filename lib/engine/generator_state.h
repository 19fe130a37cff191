// A generator's state, read and written under the generator's own lock (as LibTorch's Python
// bindings do), hidden from every op interceptor (See Note [ Internal ops ]): get_state() and
// set_state() run no ATen op today, the guard keeps it so if one ever does.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "engine/internal_ops.h"

#include <mutex>

namespace recompose::detail {

// By value: a Generator is a handle (an intrusive pointer); callers pass defaultGenerator()'s const
// one.
inline at::Tensor generator_state(at::Generator gen) {
  InternalOpsGuard internal;
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(at::Generator gen, const at::Tensor& state) {
  InternalOpsGuard internal;
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace recompose::detail
