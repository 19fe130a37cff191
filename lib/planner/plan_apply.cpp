// apply_plan() / remove_plan(): a plan turned into apply_checkpoint calls (and apply_offload).
// Every module the plan applies something to is also marked as the composable API
// "recompose.plan" (hooks::ComposableApi, no hooks of its own): remove_plan takes off what the
// plan attached, and nothing a user attached by hand afterwards.
#include "planner_targets.h"

#include "ledger/plan_entry.h"

#include <recompose/apply_checkpoint.h>
#include <recompose/apply_offload.h>
#include <recompose/checkpoint_error.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/hooks/module_state.h>
#include <recompose/planner.h>
#include <recompose/selective_checkpoint.h>
#include <recompose/swap.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace recompose {
namespace {

struct PolicyEntry {
  c10::OperatorHandle op;
  int64_t call_index;
  CheckpointPolicy policy;
};

// "aten::max.dim" -> the overload; "ns::name.default" is the overload without a name.
c10::OperatorHandle resolve_overload(const std::string& text, const std::string& module) {
  const auto dot = text.rfind('.');
  const auto ns = text.find("::");
  if (dot == std::string::npos || ns == std::string::npos || dot < ns) {
    throw std::invalid_argument("recompose: apply_plan: module '" + module + "': '" + text +
                                "' is not an op overload (\"aten::mm.default\")");
  }
  std::string overload = text.substr(dot + 1);
  if (overload == "default") overload.clear();
  auto handle = c10::Dispatcher::singleton().findSchema({text.substr(0, dot), overload});
  if (!handle) {
    throw std::invalid_argument("recompose: apply_plan: module '" + module + "': op '" + text +
                                "' is not registered in this LibTorch");
  }
  return *handle;
}

// Kept ops MUST_SAVE, swapped ones MUST_SWAP, every other op recomputed.
SelectivePolicy plan_policy(const ModulePlan& m) {
  auto entries = std::make_shared<std::vector<PolicyEntry>>();
  for (const auto& o : m.save)
    entries->push_back({resolve_overload(o.op, m.name), o.call_index, CheckpointPolicy::MUST_SAVE});
  for (const auto& o : m.swap)
    entries->push_back({resolve_overload(o.op, m.name), o.call_index, CheckpointPolicy::MUST_SWAP});
  return SelectivePolicy([entries](const SelectiveCheckpointContext& ctx,
                                   const c10::OperatorHandle& op, const torch::jit::Stack&) {
    for (const PolicyEntry& e : *entries) {
      if (e.call_index == ctx.call_index && e.op == op) return e.policy;
    }
    return CheckpointPolicy::PREFER_RECOMPUTE;
  });
}

bool needs_manager(const Plan& plan) {
  for (const auto& m : plan.modules) {
    if (m.choice == ModuleChoice::Offload || m.choice == ModuleChoice::FullSwapInputs ||
        (m.choice == ModuleChoice::Selective && !m.swap.empty())) {
      return true;
    }
  }
  return false;
}

std::string label(const ModulePlan& m) { return "'" + m.name + "' (" + m.type + ")"; }

// What apply_plan attached to one module, for remove_plan; the step ledger shows it on the
// module's rows (the engine's type: the ledger reads it there).
const hooks::ComposableApi<detail::PlanEntryState>& plan_api() {
  static const hooks::ComposableApi<detail::PlanEntryState> api(detail::kPlanApi,
                                                                "recompose::apply_plan");
  return api;
}

detail::PlanEntryState plan_entry(const ModulePlan& m) {
  detail::PlanEntryState state;
  state.entry = std::string(module_choice_name(m.choice));
  if (m.choice == ModuleChoice::Selective) {
    state.entry += " (keeps " + std::to_string(m.save.size()) + " op outputs, swaps " +
                   std::to_string(m.swap.size()) + ")";
  }
  state.estimate_bytes = m.bytes;
  state.offload = m.choice == ModuleChoice::Offload;
  return state;
}

// Takes off what apply_plan attached to `module` (nothing if the plan did not apply there).
bool remove_applied(torch::nn::Module& module) {
  auto applied = plan_api().state(module);
  if (!applied) return false;
  if (applied->offload) {
    remove_offload(module);
  } else {
    remove_checkpoint(module);
  }
  plan_api().remove(module);
  return true;
}

}  // namespace

void apply_plan(torch::nn::Module& model, const Plan& plan, const ApplyPlanOptions& options) {
  std::shared_ptr<SwapManager> manager = options.swap_manager();
  if (!manager && needs_manager(plan)) manager = SwapManager::create(SwapOptions().min_bytes(0));

  // Everything is checked before anything is attached.
  struct Target {
    std::shared_ptr<torch::nn::Module> module;
    const ModulePlan* plan;
    CheckpointOptions options;
  };
  std::vector<Target> targets;
  for (const auto& m : plan.modules) {
    auto module = detail::find_module(model, m.name);
    if (!module) {
      throw CheckpointError("recompose: apply_plan: the plan names module " + label(m) +
                            ", which " + model.name() +
                            " does not have: was the plan made for another model?");
    }
    if (module->name() != m.type) {
      throw CheckpointError("recompose: apply_plan: module '" + m.name + "' is a " +
                            module->name() + ", the plan was made for a " + m.type +
                            ": was it made for another model?");
    }
    for (const auto& api : hooks::applied_apis(*module)) {
      if (api.starts_with("recompose.")) {
        throw CheckpointError("recompose: apply_plan: module " + label(m) + " already has " + api +
                              " attached");
      }
    }
    Target t{module, &m, CheckpointOptions()};
    if (m.choice == ModuleChoice::Selective) t.options.policy(plan_policy(m)).swap_manager(manager);
    if (m.choice == ModuleChoice::FullSwapInputs) t.options.swap_inputs(true).swap_manager(manager);
    targets.push_back(std::move(t));
  }
  std::vector<torch::nn::Module*> applied;
  for (auto& t : targets) {
    if (t.plan->choice == ModuleChoice::None) continue;
    try {
      switch (t.plan->choice) {
        case ModuleChoice::None:
          break;
        case ModuleChoice::Full:
        case ModuleChoice::FullSwapInputs:
        case ModuleChoice::Selective:
          apply_checkpoint(*t.module, t.options);
          break;
        // The estimate counts every offloaded byte as gone: the last call's too.
        case ModuleChoice::Offload:
          apply_offload(*t.module, OffloadOptions().manager(manager).keep_last_on_device(false));
          break;
      }
      applied.push_back(t.module.get());  // all or nothing from here on, mark or not
      plan_api().apply(*t.module, std::make_shared<detail::PlanEntryState>(plan_entry(*t.plan)),
                       [](hooks::ApiHooks&, const std::weak_ptr<detail::PlanEntryState>&) {});
    } catch (...) {
      for (auto* m : applied) {
        plan_api().remove(*m);
        if (!remove_checkpoint(*m)) remove_offload(*m);
      }
      throw;
    }
  }
}

int64_t remove_plan(torch::nn::Module& model, const Plan& plan) {
  int64_t removed = 0;
  for (const auto& m : plan.modules) {
    auto module = detail::find_module(model, m.name);
    if (module && remove_applied(*module)) ++removed;
  }
  return removed;
}

}  // namespace recompose
