// What a random op did to the random-number generators in the forward. Selective checkpointing
// replays a kept random op's output without running it; unless the replay also moves the
// generators, every later random op of the recomputation draws other numbers than in the
// forward (and the gradients silently differ).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <utility>
#include <vector>

namespace recompose::detail {

class GeneratorEffect {
 public:
  // Call before `op` runs, its arguments on top of `stack`. Records the state of every generator
  // it may draw from: its Generator arguments, the default generators of the devices of its
  // tensor and Device arguments, and the default CPU generator always.
  static GeneratorEffect before(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

  // Call after the op ran: records where it left the generators.
  void after();

  // In the recomputation, in place of running the op: if every generator is where the forward
  // found it, moves each to where the forward left it and returns true. Otherwise (the region's
  // generator state was not restored, e.g. preserve_rng_state(false), or a generator the engine
  // does not restore) changes nothing and returns false: the caller runs the op to advance them
  // as a recomputation would, rather than rewinding them into the forward's past.
  bool replay() const;

  // Selective replay, in place of nothing: puts every generator back where the forward found it,
  // so that running the op again draws what it drew.
  void rewind() const;
  // Adds the generators this effect covers to `gens`, each once.
  void collect(std::vector<at::Generator>& gens) const;

 private:
  struct State {
    at::Generator generator;
    at::Tensor before;
    at::Tensor after;
  };
  std::vector<State> states_;
};

}  // namespace recompose::detail
