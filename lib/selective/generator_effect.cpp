#include "generator_effect.h"

#include "engine/generator_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace recompose::detail {
namespace {

// States are CPU byte tensors (an engine's words, or a seed and an offset): compared as bytes,
// without dispatching an op.
bool same_state(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

void add_generator(std::vector<at::Generator>& gens, at::Generator gen) {
  if (!gen.defined()) return;
  for (const at::Generator& g : gens) {
    if (g == gen) return;
  }
  gens.push_back(std::move(gen));
}

void add_device(std::vector<at::Generator>& gens, const c10::Device& device) {
  if (device.is_cpu() || device.is_meta()) return;  // CPU: always added; meta draws nothing
  try {
    add_generator(gens, at::globalContext().defaultGenerator(device));
  } catch (const c10::Error&) {
    // A device type without a default generator: nothing to keep in step.
  }
}

}  // namespace

GeneratorEffect GeneratorEffect::before(const c10::OperatorHandle& op,
                                        const torch::jit::Stack& stack) {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  const size_t n_args = op.schema().arguments().size();
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n_args); it != stack.end(); ++it) {
    const c10::IValue& v = *it;
    if (v.isGenerator()) {
      add_generator(gens, v.toGenerator());
    } else if (v.isTensor()) {
      if (v.toTensor().defined()) add_device(gens, v.toTensor().device());
    } else if (v.isDevice()) {
      add_device(gens, v.toDevice());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) add_device(gens, t.device());
    }
  }
  GeneratorEffect effect;
  effect.states_.reserve(gens.size());
  for (at::Generator& gen : gens) {
    at::Tensor start = generator_state(gen);
    effect.states_.push_back({std::move(gen), std::move(start), at::Tensor()});
  }
  return effect;
}

void GeneratorEffect::after() {
  for (State& s : states_) s.after = generator_state(s.generator);
}

bool GeneratorEffect::replay() const {
  for (const State& s : states_) {
    at::Generator gen = s.generator;
    if (!same_state(generator_state(gen), s.before)) return false;
  }
  for (const State& s : states_) {
    at::Generator gen = s.generator;
    set_generator_state(gen, s.after);
  }
  return true;
}

void GeneratorEffect::rewind() const {
  for (const State& s : states_) {
    at::Generator gen = s.generator;
    set_generator_state(gen, s.before);
  }
}

void GeneratorEffect::collect(std::vector<at::Generator>& gens) const {
  for (const State& s : states_) add_generator(gens, s.generator);
}

}  // namespace recompose::detail
