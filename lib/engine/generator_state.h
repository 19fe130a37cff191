// A generator's state, read and written under the generator's own lock (as LibTorch's Python
// bindings do), hidden from every op interceptor (See Note [ Internal ops ]): get_state() and
// set_state() run no ATen op today, the guard keeps it so if one ever does. GeneratorStash: the
// states of several, put back (the replay's, the tools' ModelStateGuard).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "engine/internal_ops.h"

#include <mutex>
#include <utility>
#include <vector>

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

// The states of some generators, taken when it is made. restore() puts them back (any number of
// times); with `restore_on_exit`, so does its destructor, also when an exception unwinds (a
// replay's rewinds leave the generators as backward found them).
class GeneratorStash {
 public:
  GeneratorStash() = default;
  explicit GeneratorStash(std::vector<at::Generator> generators, bool restore_on_exit = true)
      : restore_on_exit_(restore_on_exit) {
    states_.reserve(generators.size());
    for (at::Generator& gen : generators) {
      at::Tensor state = generator_state(gen);
      states_.emplace_back(std::move(gen), std::move(state));
    }
  }
  ~GeneratorStash() {
    if (!restore_on_exit_) return;
    try {
      restore();
    } catch (...) {  // NOLINT(bugprone-empty-catch): set_state of a state it read does not throw
    }
  }
  GeneratorStash(GeneratorStash&&) = default;
  GeneratorStash& operator=(GeneratorStash&&) = default;
  GeneratorStash(const GeneratorStash&) = delete;
  GeneratorStash& operator=(const GeneratorStash&) = delete;

  void restore() const {
    for (const auto& [gen, state] : states_) set_generator_state(gen, state);
  }

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> states_;
  bool restore_on_exit_ = false;
};

}  // namespace recompose::detail
