#include "engine/model_state_guard.h"

#include "engine/seen_once.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <utility>

namespace recompose::detail {

ModelStateGuard::ModelStateGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& roots,
                                 unsigned parts, const std::optional<c10::Device>& device)
    : uncaught_on_entry_(std::uncaught_exceptions()) {
  std::vector<torch::nn::Module*> raw;
  for (const auto& r : roots) {
    if (r) raw.push_back(r.get());
  }
  record(raw, parts, device);
}

ModelStateGuard::ModelStateGuard(torch::nn::Module& model, const c10::Device& device)
    : uncaught_on_entry_(std::uncaught_exceptions()) {
  record({&model}, kWholeModelState, device);
}

void ModelStateGuard::record(const std::vector<torch::nn::Module*>& roots, unsigned parts,
                             const std::optional<c10::Device>& device) {
  at::NoGradGuard no_grad;
  SeenOnce<const c10::TensorImpl*> seen;  // a module shared in the tree lists its tensors twice
  std::vector<c10::Device> devices;       // CUDA devices whose default generator is recorded
  auto add_device = [&devices](const c10::Device& d) {
    if (d.is_cuda() && std::find(devices.begin(), devices.end(), d) == devices.end())
      devices.push_back(d);
  };
  if (device) add_device(*device);
  for (torch::nn::Module* root : roots) {
    if (parts & kModes) modes_.add_tree(*root);
    for (const auto& p : root->parameters()) {
      if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl())) continue;
      add_device(p.device());
      if (parts & kParameters) values_.push_back(value_of(p));
      if (parts & kGrads) {
        const at::Tensor& g = p.grad();
        grads_.push_back({p, g.defined() ? value_of(g) : Value{}});
      }
    }
    for (const auto& b : root->buffers()) {
      if (!b.defined() || !seen.insert(b.unsafeGetTensorImpl())) continue;
      add_device(b.device());
      if (parts & kBuffers) values_.push_back(value_of(b));
    }
  }
  if (!(parts & kGenerators)) return;
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  for (const c10::Device& d : devices)
    generators.push_back(at::globalContext().defaultGenerator(d));
  generators_ = GeneratorStash(std::move(generators), /*restore_on_exit=*/false);
}

ModelStateGuard::~ModelStateGuard() {
  if (std::uncaught_exceptions() <= uncaught_on_entry_) return;
  try {
    restore();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

ModelStateGuard::Value ModelStateGuard::value_of(const at::Tensor& t) {
  // copy=true: a tensor already in host memory is cloned, not shared.
  return {t, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true), t.device(),
          t._version()};
}

// Written back only when the step changed it: its version counter moved, or (some kernels, such
// as BatchNorm's, write without moving it) its value differs.
void ModelStateGuard::restore_value(Value& v) {
  at::Tensor& t = v.tensor;
  if (t.sizes() != v.saved.sizes() || t.dtype() != v.saved.dtype() || t.device() != v.device) {
    // Replaced by a tensor of another shape: the same variable again.
    t.set_data(v.saved.to(v.device, /*non_blocking=*/false, /*copy=*/true));
  } else if (t._version() != v.version || !at::equal(t.to(at::kCPU), v.saved)) {
    // Below ADInplaceOrView: the entry bits go back without moving the version counter, which
    // tensors autograd saved before the run still check (BatchNorm's kernel writes its running
    // statistics the same way; a counter the run moved stays where the run left it).
    at::AutoDispatchBelowADInplaceOrView below;
    t.detach().copy_(v.saved);
  } else {
    return;
  }
  v.version = t._version();
}

void ModelStateGuard::restore() {
  at::NoGradGuard no_grad;
  for (Value& v : values_) restore_value(v);
  for (Grad& g : grads_) {
    if (!g.grad.tensor.defined()) {
      if (g.param.grad().defined()) g.param.mutable_grad() = at::Tensor();
      continue;
    }
    // The step may have set .grad to none and let backward make a new one: the user's tensor again.
    if (!g.param.grad().is_same(g.grad.tensor)) g.param.mutable_grad() = g.grad.tensor;
    restore_value(g.grad);
  }
  modes_.put_back();
  generators_.restore();
}

}  // namespace recompose::detail
