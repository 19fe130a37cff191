#include "fully_shard.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/checkpoint_state.h>

#include <recompose/hooks/forward_call.h>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

namespace sharded {
namespace {

// One per parameter; the last parameter of a unit to get its gradient triggers the reduce-scatter.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit GradReadyHook(std::weak_ptr<FlatShard> flat) : flat_(std::move(flat)) {}
  void operator()(const torch::autograd::Variable&) override {
    if (auto f = flat_.lock()) f->on_grad_ready();
  }

 private:
  std::weak_ptr<FlatShard> flat_;
};

// apply_checkpoint makes every forward of the module with grad mode on a checkpointed region.
bool forward_is_checkpointed(const torch::nn::Module& module) {
  return torch::GradMode::is_enabled() && recompose::is_checkpointed(module);
}

}  // namespace

FullyShard::~FullyShard() {
  for (auto& u : units_) {
    for (auto& h : u.hooks) h.remove();
    for (const auto& p : u.flat->params())
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void FullyShard::add_unit(torch::nn::Module& unit, const std::string& name) {
  std::vector<torch::Tensor> params = unit.parameters(/*recurse=*/true);
  for (const auto& p : params) {
    for (const auto& f : flats_) {
      for (const auto& q : f->params()) {
        if (q.is_same(p))
          throw std::invalid_argument("sharded: a parameter of '" + name +
                                      "' is already in unit '" + f->name() + "'");
      }
    }
  }
  auto flat = std::make_shared<FlatShard>(pg_, name, std::move(params), counts_);
  std::weak_ptr<FlatShard> weak = flat;
  for (const auto& p : flat->params()) {
    torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<GradReadyHook>(weak));
  }

  Unit u{unit.shared_from_this(), flat, {}};
  using recompose::hooks::ForwardCall;
  using recompose::hooks::HookOptions;
  u.hooks.push_back(recompose::hooks::register_forward_pre_hook(
      unit,
      [weak](ForwardCall&) {
        if (auto f = weak.lock())
          f->unshard(recompose::is_recomputing() ? Phase::Recompute : Phase::Forward);
      },
      HookOptions().owner(kHookOwner)));
  u.hooks.push_back(recompose::hooks::register_forward_hook(
      unit,
      [weak](ForwardCall& call) {
        auto f = weak.lock();
        if (!f) return;
        // Recomputation in backward: the block's backward runs next and needs the parameters;
        // they are freed after its reduce-scatter.
        if (recompose::is_recomputing()) return;
        if (!call.error() && !forward_is_checkpointed(call.module())) {
          for (const auto& out : call.output_leaves()) {
            if (out.defined() && out.requires_grad()) {
              // Fires when the output's gradient is ready, before the block's backward nodes.
              out.register_hook([weak](const torch::Tensor&) {
                if (auto g = weak.lock()) g->unshard(Phase::Backward);
              });
            }
          }
        }
        f->reshard();
      },
      HookOptions().always_call(true).owner(kHookOwner)));
  units_.push_back(std::move(u));
  flats_.push_back(std::move(flat));
}

std::vector<torch::Tensor> FullyShard::shards() const {
  std::vector<torch::Tensor> out;
  for (const auto& f : flats_) out.push_back(f->shard());
  return out;
}

void FullyShard::verify_step() {
  for (auto& u : units_) {
    FlatShard& f = *u.flat;
    const auto module = u.module.lock();
    const bool checkpointed = module && recompose::is_checkpointed(*module);
    const auto& g = f.step_gathers();
    const int fwd = g[std::size_t(Phase::Forward)], rec = g[std::size_t(Phase::Recompute)],
              bwd = g[std::size_t(Phase::Backward)];
    std::string problem;
    if (f.is_unsharded())
      problem = "still holds its full parameters after backward";
    else if (f.grads_pending() != 0)
      problem = "got gradients for only some of its parameters";
    else if (fwd != 1 || rec != (checkpointed ? 1 : 0) || bwd != (checkpointed ? 0 : 1) ||
             f.step_scatters() != 1) {
      problem = "issued all-gathers forward/recompute/backward = " + std::to_string(fwd) + "/" +
                std::to_string(rec) + "/" + std::to_string(bwd) + " and " +
                std::to_string(f.step_scatters()) + " reduce-scatters; expected 1/" +
                (checkpointed ? "1/0" : "0/1") + " and 1";
    }
    if (!problem.empty()) throw std::runtime_error("sharded: unit '" + f.name() + "' " + problem);
    f.reset_step_counts();
  }
}

void FullyShard::unshard_all() {
  for (auto& f : flats_) f->unshard(Phase::State);
}

void FullyShard::reshard_all() {
  for (auto& f : flats_) f->reshard();
}

}  // namespace sharded
