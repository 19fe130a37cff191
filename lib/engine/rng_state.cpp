#include "engine/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>  // getDefaultCPUGenerator
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>

#include "engine/device_adapter.h"
#include "engine/generator_state.h"

namespace recompose::detail {
namespace {

// The CPU generator's state now, shared with the last region captured on this thread when it is
// the same: a model whose regions draw no random numbers stashes one copy, not one per region (a
// frame ~2.5 KB smaller, an allocation and a copy fewer per region). Equal states replay equal
// draws, so sharing changes nothing a recomputation sees.
std::shared_ptr<const CpuGeneratorState> share_cpu_generator_state() {
  thread_local std::shared_ptr<const CpuGeneratorState> last;
  CpuGeneratorState now = read_cpu_generator(at::detail::getDefaultCPUGenerator());
  if (!last || !same_cpu_generator_state(*last, now))
    last = std::make_shared<const CpuGeneratorState>(now);
  return last;
}

c10::SmallVector<c10::DeviceType, 2> autocast_device_types(const std::vector<at::Tensor>& inputs) {
  c10::SmallVector<c10::DeviceType, 2> types{c10::DeviceType::CPU};
  for (const auto& t : inputs) {
    if (!t.defined()) continue;
    auto type = t.device().type();
    if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
  }
  return types;
}

}  // namespace

ForwardState capture_forward_state(const std::vector<at::Tensor>& inputs, bool preserve_rng) {
  ForwardState state;
  for (auto type : autocast_device_types(inputs)) {
    if (!at::autocast::is_autocast_available(type)) continue;
    state.autocast.push_back(
        {type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
  }
  state.autocast_cache = at::autocast::is_autocast_cache_enabled();
  if (!preserve_rng) return state;
  if (at::hasCUDA()) {
    const auto& hooks = at::globalContext().getAcceleratorHooksInterface(c10::DeviceType::CUDA);
    const auto count = device_count(c10::DeviceType::CUDA);
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      if (!hooks.hasPrimaryContext(i)) state.uninitialised_cuda.push_back(i);
    }
  }
  state.cpu_rng = share_cpu_generator_state();
  for (const auto& t : inputs) {
    if (!t.defined() || t.device().is_cpu() || t.device().is_meta()) continue;
    const c10::Device device = t.device();
    bool seen = false;
    for (const auto& [d, s] : state.device_rng) seen = seen || d == device;
    if (seen) continue;
    state.device_rng.emplace_back(device,
                                  generator_state(at::globalContext().defaultGenerator(device)));
  }
  return state;
}

std::string device_initialised_since(const ForwardState& state) {
  if (state.uninitialised_cuda.empty()) return {};
  const auto& hooks = at::globalContext().getAcceleratorHooksInterface(c10::DeviceType::CUDA);
  for (c10::DeviceIndex i : state.uninitialised_cuda) {
    if (hooks.hasPrimaryContext(i)) return "cuda:" + std::to_string(i);
  }
  return {};
}

ForwardStateRestorer::ForwardStateRestorer(const ForwardState& state) {
  // Remember what is in place now, then install the forward's state.
  saved_.autocast_cache = at::autocast::is_autocast_cache_enabled();
  for (const auto& a : state.autocast) {
    saved_.autocast.push_back({a.device_type, at::autocast::is_autocast_enabled(a.device_type),
                               at::autocast::get_autocast_dtype(a.device_type)});
    at::autocast::set_autocast_enabled(a.device_type, a.enabled);
    at::autocast::set_autocast_dtype(a.device_type, a.dtype);
  }
  at::autocast::set_autocast_cache_enabled(state.autocast_cache);
  if (state.cpu_rng) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    saved_cpu_rng_.emplace(read_cpu_generator(gen));
    // Regions that draw nothing leave the generator where their forwards found it: a compare
    // instead of two ~2.5 KB writes.
    if (!same_cpu_generator_state(*saved_cpu_rng_, *state.cpu_rng)) {
      write_cpu_generator(gen, *state.cpu_rng);
      cpu_rng_written_ = true;
    }
    for (const auto& [device, rng] : state.device_rng) {
      auto gen = at::globalContext().defaultGenerator(device);
      saved_.device_rng.emplace_back(device, generator_state(gen));
      set_generator_state(gen, rng);
    }
  }
  // As torch.autocast does on entry: the recomputation is one more autocast scope, so the casts
  // it caches are dropped when it leaves (below) unless an enclosing scope is still open.
  at::autocast::increment_nesting();
}

ForwardStateRestorer::~ForwardStateRestorer() {
  for (const auto& a : saved_.autocast) {
    at::autocast::set_autocast_enabled(a.device_type, a.enabled);
    at::autocast::set_autocast_dtype(a.device_type, a.dtype);
  }
  at::autocast::set_autocast_cache_enabled(saved_.autocast_cache);
  // Casts cached by the recomputation are copies of the weights as they are now; left in the
  // cache, the next forward (after the optimizer's step) would use them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (!saved_cpu_rng_) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  if (cpu_rng_written_ || !same_cpu_generator_state(read_cpu_generator(gen), *saved_cpu_rng_)) {
    write_cpu_generator(gen, *saved_cpu_rng_);
  }
  for (const auto& [device, rng] : saved_.device_rng) {
    set_generator_state(at::globalContext().defaultGenerator(device), rng);
  }
}

}  // namespace recompose::detail
