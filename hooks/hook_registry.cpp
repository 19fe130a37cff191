// Registration and removal of forward hooks, and the per-call decision of which hooks run.
#include "module_registry.h"

#include <recompose/checkpoint_error.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/hooks/forward_annotation.h>
#include <recompose/hooks/forward_hooks.h>

#include <torch/nn/module.h>

#include <c10/util/Type.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <typeindex>
#include <unordered_set>

namespace recompose::hooks {
namespace detail {

namespace {

std::mutex& annotated_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_set<std::type_index>& annotated_types() {
  static auto* types = new std::unordered_set<std::type_index>();
  return *types;
}

// The module whose next forward entry on this thread is the body call of an intercepted call.
thread_local const torch::nn::Module* tl_body_call = nullptr;
thread_local const CallArguments* tl_body_arguments = nullptr;  // what the body call must receive

struct Suppressed {
  const torch::nn::Module* module;
  // A view: an OwnerSuppression lives inside StoredCall::invoke, whose caller keeps the owner's
  // string alive for the whole call (a copy would allocate at every recomputation).
  std::string_view owner;
};
thread_local std::vector<Suppressed> tl_suppressed;

std::string_view suppressed_owner_for(const torch::nn::Module& module) {
  // Innermost suppression wins: a re-invocation inside a re-invocation names its own owner.
  for (auto it = tl_suppressed.rbegin(); it != tl_suppressed.rend(); ++it) {
    if (it->module == &module) return it->owner;
  }
  return {};
}

bool is_suppressed(const HookRecord& h, std::string_view owner) {
  return !owner.empty() && h.options.owner() == owner;
}

HookHandle add_hook(torch::nn::Module& module, ForwardHook hook, HookOptions options, bool is_pre) {
  if (!hook) throw std::invalid_argument("recompose: cannot register an empty hook function");
  if (!has_annotated_forward(module)) {
    const std::string type = c10::demangle(typeid(module).name());
    throw std::invalid_argument("recompose: cannot register a forward hook on " + type +
                                ": its forward() is not annotated. " + how_to_annotate(module, {}));
  }
  if (is_pre && options.always_call()) {
    throw std::invalid_argument("recompose: always_call applies to forward (post) hooks only");
  }
  auto record = std::make_shared<HookRecord>();
  record->fn = std::move(hook);
  record->options = std::move(options);
  record->is_pre = is_pre;
  record->module = &module;

  auto& reg = ModuleRegistry::instance();
  ExpiredEntries dead;  // declared first: destroyed after the lock is released
  std::unique_lock lock(reg.mutex());
  reg.take_expired(dead);
  ModuleEntry& entry = reg.entry_for_write(module, dead);
  const bool had_hooks = entry.has_hooks();
  auto& list = is_pre ? entry.pre : entry.post;
  auto next = std::make_shared<HookList>(*list);
  if (record->options.prepend()) {
    next->insert(next->begin(), record);
  } else {
    next->push_back(record);
  }
  list = std::move(next);
  if (!had_hooks) reg.hooked_modules().fetch_add(1);
  return HookHandle(record);
}

}  // namespace

bool register_annotated_type(const std::type_info& type) {
  std::lock_guard lock(annotated_mutex());
  annotated_types().insert(std::type_index(type));
  return true;
}

bool plan_forward(torch::nn::Module& module, HookPlan& plan) {
  if (tl_body_call == &module) {
    tl_body_call = nullptr;
    plan.body_arguments = tl_body_arguments;
    return false;
  }
  auto& reg = ModuleRegistry::instance();
  if (reg.entry_count() == 0) return false;  // nothing registered anywhere: the fast path
  // No destructor hook tells us a module died: forwards sweep now and then.
  reg.purge_expired_amortized();
  if (reg.hooked_modules().load(std::memory_order_acquire) == 0) return false;
  std::shared_ptr<const HookList> pre, post;
  {
    std::shared_lock lock(reg.mutex());
    const ModuleEntry* entry = reg.find(module);
    if (entry == nullptr) return false;
    pre = entry->pre;
    post = entry->post;
  }
  if (pre->empty() && post->empty()) return false;
  // A re-invocation with every hook of this module suppressed (a recomputation) needs no plan.
  const std::string_view suppressed = suppressed_owner_for(module);
  if (!suppressed.empty()) {
    auto any_live = [&](const HookList& l) {
      return std::any_of(l.begin(), l.end(),
                         [&](const auto& h) { return !is_suppressed(*h, suppressed); });
    };
    if (!any_live(*pre) && !any_live(*post)) return false;
  }
  plan.pre = std::move(pre);
  plan.post = std::move(post);
  plan.suppressed = suppressed;
  return true;
}

void mark_body_call(const torch::nn::Module& module, const CallArguments& passed) {
  tl_body_call = &module;
  tl_body_arguments = &passed;
}

void throw_not_first_statement(const torch::nn::Module& module) {
  throw ::recompose::CheckpointError(
      "recompose: the forward of " + module.name() +
      " does not begin with RECOMPOSE_FORWARD: the hooks called it again with the arguments the "
      "annotation received, and the annotation then received other tensors, so a statement "
      "before it ran twice (e.g. `x = x * 2; RECOMPOSE_FORWARD(x);`) and the output would differ "
      "from the forward without hooks. Make RECOMPOSE_FORWARD(...) the first statement of "
      "forward, naming its parameters as they come in.");
}
void clear_body_call(const torch::nn::Module& module) {
  if (tl_body_call == &module) tl_body_call = nullptr;
}

OwnerSuppression::OwnerSuppression(const torch::nn::Module& module, std::string_view owner) {
  tl_suppressed.push_back({&module, owner});
}
OwnerSuppression::~OwnerSuppression() { tl_suppressed.pop_back(); }

void HookRunner::run_pre() {
  for (const auto& h : *plan_.pre) {
    if (h->removed.load() || is_suppressed(*h, plan_.suppressed)) continue;
    h->fn(call_);
  }
}

void HookRunner::run_post() {
  const HookList& post = *plan_.post;
  for (; post_done_ < post.size();) {
    const auto& h = post[post_done_++];
    if (h->removed.load() || is_suppressed(*h, plan_.suppressed)) continue;
    h->fn(call_);
  }
}

void HookRunner::run_post_after_error(std::exception_ptr error) noexcept {
  call_.set_error(error);
  const HookList& post = *plan_.post;
  for (; post_done_ < post.size();) {
    const auto& h = post[post_done_++];
    if (!h->options.always_call() || h->removed.load() || is_suppressed(*h, plan_.suppressed))
      continue;
    try {
      h->fn(call_);
    } catch (...) {
      // As in PyTorch: the original exception wins; this one is dropped.
    }
  }
}

}  // namespace detail

bool has_annotated_forward(const torch::nn::Module& module) {
  std::lock_guard lock(detail::annotated_mutex());
  return detail::annotated_types().count(std::type_index(typeid(module))) > 0;
}

HookHandle register_forward_pre_hook(torch::nn::Module& module, ForwardHook hook,
                                     HookOptions options) {
  return detail::add_hook(module, std::move(hook), std::move(options), /*is_pre=*/true);
}

HookHandle register_forward_hook(torch::nn::Module& module, ForwardHook hook, HookOptions options) {
  return detail::add_hook(module, std::move(hook), std::move(options), /*is_pre=*/false);
}

std::size_t hook_count(const torch::nn::Module& module) {
  auto& reg = detail::ModuleRegistry::instance();
  reg.purge_expired();
  std::shared_lock lock(reg.mutex());
  const detail::ModuleEntry* entry = reg.find(module);
  return entry == nullptr ? 0 : entry->pre->size() + entry->post->size();
}

void HookHandle::remove() {
  // Declared first: the record (its callable is user code) is destroyed after the lock is released.
  const std::shared_ptr<detail::HookRecord> record = record_.lock();
  if (!record || record->removed.exchange(true)) return;
  auto& reg = detail::ModuleRegistry::instance();
  detail::ExpiredEntries dead;  // declared first: destroyed after the lock is released
  std::unique_lock lock(reg.mutex());
  reg.take_expired(dead);
  detail::ModuleEntry* entry = reg.find_mutable(*record->module);
  if (entry == nullptr) return;  // the module is gone (and its entry purged)
  auto& list = record->is_pre ? entry->pre : entry->post;
  auto next = std::make_shared<detail::HookList>(*list);
  const auto old_size = next->size();
  next->erase(std::remove(next->begin(), next->end(), record), next->end());
  if (next->size() == old_size) return;  // a new module now lives at that address
  list = std::move(next);
  if (!entry->has_hooks()) reg.hooked_modules().fetch_sub(1);
  reg.erase_if_empty(*record->module);
}

bool HookHandle::active() const {
  const std::shared_ptr<detail::HookRecord> record = record_.lock();
  return record && !record->removed.load();
}

std::shared_ptr<void>& ForwardCall::slot(std::string_view owner) {
  for (std::size_t i = 0; i < inline_used_; ++i) {
    if (inline_slots_[i].owner() == owner) return inline_slots_[i].value;
  }
  if (more_slots_) {
    for (auto& [name, value] : *more_slots_) {
      if (name == owner) return value;
    }
  }
  if (inline_used_ < kInlineSlots && owner.size() <= inline_slots_[0].name.size()) {
    InlineSlot& fresh = inline_slots_[inline_used_++];
    std::copy(owner.begin(), owner.end(), fresh.name.begin());
    fresh.name_size = owner.size();
    return fresh.value;
  }
  if (!more_slots_)
    more_slots_ = std::make_unique<std::deque<std::pair<std::string, std::shared_ptr<void>>>>();
  more_slots_->emplace_back(std::string(owner), nullptr);
  return more_slots_->back().second;
}

}  // namespace recompose::hooks
