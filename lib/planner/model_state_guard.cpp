#include "model_state_guard.h"

#include "engine/generator_state.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <set>

namespace recompose::detail {

ModelStateGuard::ModelStateGuard(torch::nn::Module& model, const c10::Device& device)
    : uncaught_on_entry_(std::uncaught_exceptions()),
      root_(&model),
      root_training_(model.is_training()) {
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    modes_.emplace_back(item.value(), item.value()->is_training());
  }
  at::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> seen;  // a module shared in the tree lists its tensors twice
  for (const auto& p : model.parameters()) {
    if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    values_.push_back(value_of(p));
    const at::Tensor& g = p.grad();
    grads_.push_back({p, g.defined() ? value_of(g) : Value{}});
  }
  for (const auto& b : model.buffers()) {
    if (!b.defined() || !seen.insert(b.unsafeGetTensorImpl()).second) continue;
    values_.push_back(value_of(b));
  }
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  if (device.is_cuda()) generators.push_back(at::globalContext().defaultGenerator(device));
  for (auto& g : generators) generators_.push_back({g, generator_state(g)});
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
  // train(bool) recurses into the children: set the root first, then each module in pre-order.
  bool modes_moved = root_->is_training() != root_training_;
  for (const auto& [m, training] : modes_)
    modes_moved = modes_moved || m->is_training() != training;
  if (modes_moved) {
    root_->train(root_training_);
    for (const auto& [m, training] : modes_) m->train(training);
  }
  for (auto& g : generators_) set_generator_state(g.generator, g.state);
}

}  // namespace recompose::detail
