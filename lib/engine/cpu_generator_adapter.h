// The CPU generator's whole state as a plain value: its Mersenne Twister engine and the normal
// samples it keeps for the next draw. Copying it is a memcpy of ~2.5 KB, where get_state and
// set_state serialise it into a fresh tensor and parse it back (the RNG stash of every region).
// Implemented in cpu_generator_adapter.cpp, the only file that uses CPUGeneratorImpl's engine
// accessors.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <optional>

namespace recompose::detail {

struct CpuGeneratorState {
  at::mt19937 engine;
  // Box-Muller draws two normal samples and keeps the second for the next draw.
  std::optional<float> next_float_normal;
  std::optional<double> next_double_normal;
};

// The state of `gen`, a CPU generator, read under its mutex.
CpuGeneratorState read_cpu_generator(at::Generator gen);

// Puts `state` in place in `gen`, a CPU generator, under its mutex.
void write_cpu_generator(at::Generator gen, const CpuGeneratorState& state);

// True if `a` and `b` are the same state: restoring either replays the same draws.
bool same_cpu_generator_state(const CpuGeneratorState& a, const CpuGeneratorState& b);

}  // namespace recompose::detail
