// Adapter: at::CPUGeneratorImpl's engine and normal-sample accessors (engine/set_engine,
// next_{float,double}_normal_sample and their setters). Together they are the generator's whole
// state, the same fields CPUGeneratorImpl::get_state serialises. Also at::mt19937's layout: its
// mt19937_data_pod is its only member (checked at compile time), read in place to compare.
#include "engine/cpu_generator_adapter.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/cpu_generator_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check ATen/CPUGeneratorImpl.h (engine(), set_engine(), the \
normal-sample caches) and ATen/core/PhiloxRNGEngine.h / mt19937 state, then extend torch_version_guard.h"
#endif

#include <recompose/checkpoint_error.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <mutex>
#include <type_traits>

namespace recompose::detail {
namespace {

at::CPUGeneratorImpl* cpu_impl(const at::Generator& gen) {
  if (!gen.defined() || !gen.device().is_cpu()) {
    // Callers pass the default CPU generator or one they found on the CPU: a bug of recompose's.
    throw CheckpointError(
        "recompose: internal error: the CPU generator stash was given a generator that is not "
        "a CPU generator; please report it");
  }
  return gen.get<at::CPUGeneratorImpl>();
}

}  // namespace

CpuGeneratorState read_cpu_generator(at::Generator gen) {
  auto* impl = cpu_impl(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return CpuGeneratorState{impl->engine(), impl->next_float_normal_sample(),
                           impl->next_double_normal_sample()};
}

void write_cpu_generator(at::Generator gen, const CpuGeneratorState& state) {
  auto* impl = cpu_impl(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  impl->set_engine(state.engine);
  impl->set_next_float_normal_sample(state.next_float_normal);
  impl->set_next_double_normal_sample(state.next_double_normal);
}

bool same_cpu_generator_state(const CpuGeneratorState& a, const CpuGeneratorState& b) {
  // Field by field, in place: data() would copy ~2.5 KB per side, and comparing the bytes would
  // read the pod's padding. mt19937_engine is standard-layout with the pod as its only member,
  // so a pointer to the engine is a pointer to its pod.
  static_assert(std::is_standard_layout_v<at::mt19937> &&
                sizeof(at::mt19937) == sizeof(at::mt19937_data_pod));
  const auto& x = *reinterpret_cast<const at::mt19937_data_pod*>(&a.engine);
  const auto& y = *reinterpret_cast<const at::mt19937_data_pod*>(&b.engine);
  // The words of the state array have no padding between them: one memcmp (std::array's ==
  // compares word by word).
  return x.seed_ == y.seed_ && x.left_ == y.left_ && x.seeded_ == y.seeded_ && x.next_ == y.next_ &&
         std::memcmp(x.state_.data(), y.state_.data(), sizeof(x.state_)) == 0 &&
         a.next_float_normal == b.next_float_normal && a.next_double_normal == b.next_double_normal;
}

}  // namespace recompose::detail
