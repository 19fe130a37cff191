// RECOMPOSE_FORWARD(args...): the one-line annotation that makes a module's forward hookable.
//
// Put it as the FIRST statement of forward, naming every parameter in order:
//
//   torch::Tensor forward(torch::Tensor x, std::optional<torch::Tensor> mask, double scale) {
//     RECOMPOSE_FORWARD(x, mask, scale);
//     ...
//   }
//
// How it works: when hooks are registered on this module instance, the annotation runs the
// pre-hooks, calls forward again (that nested call skips the annotation and runs the body),
// runs the post-hooks with the output, and returns the output. With no hooks or state registered
// anywhere it costs one thread-local read and one atomic read; otherwise also a thread-local
// count (every kForwardPurgePeriod-th forward sweeps out dead modules, see module_lifetime.h) and,
// when some module has hooks, a table lookup.
// Parameter types must be supported by recompose::hooks::ArgTraits (tensors, plain values, and
// optionals, vectors, tuples and pairs of supported types: a KV cache as
// std::optional<std::tuple<Tensor, Tensor>>; specialise ArgTraits for your own types), taken by
// value, const reference or lvalue reference.
//
// Under hooks, a statement before the annotation would run twice (once before the hooks, once in
// the body call they make): the body call's annotation checks that it receives the tensors it was
// passed and throws recompose::CheckpointError naming the module when not.
//
// Limits: forward must not take rvalue-reference parameters; an annotation in a base class's
// forward registers the base class, so annotate the forward of the class you register hooks on.
#pragma once

#include <recompose/hooks/arg_traits.h>
#include <recompose/hooks/forward_call.h>

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace recompose::hooks::detail {

// Records, at static-initialisation time, that a module type has an annotated forward: the
// annotation odr-uses AnnotatedType<M>::registered, which instantiates this initialiser.
bool register_annotated_type(const std::type_info& type);
template <class M>
struct AnnotatedType {
  static const bool registered;
};
template <class M>
const bool AnnotatedType<M>::registered = register_annotated_type(typeid(M));

struct HookRecord;  // one registered hook (module_registry.h)
using HookList = std::vector<std::shared_ptr<HookRecord>>;

// The hooks that apply to one call. Held by the call's gate, by value: a plan per hooked forward
// would otherwise be an allocation of its own.
struct HookPlan {
  // Snapshots of the module's lists (copy-on-write: registration during the call replaces them).
  std::shared_ptr<const HookList> pre;
  std::shared_ptr<const HookList> post;
  // Owner whose hooks are off for this call ("" = none): a view of the string the enclosing
  // OwnerSuppression was given, which outlives this call (it lives inside StoredCall::invoke or
  // rerun, around the re-invocation that this plan belongs to).
  std::string_view suppressed;
  // The nested body call only: the arguments the annotation passed in (null otherwise).
  const CallArguments* body_arguments = nullptr;
};

// Decides whether this call of forward runs hooks and fills `plan` if so: false for the nested
// body call, and when no hook applies.
bool plan_forward(torch::nn::Module& module, HookPlan& plan);
// Marks the next entry into `module`'s forward on this thread as the body call, which must
// receive `passed` (checked by the body call's annotation).
void mark_body_call(const torch::nn::Module& module, const CallArguments& passed);
// The body call's annotation received tensors other than those passed in: a statement before
// the annotation ran again. Throws recompose::CheckpointError naming the module.
[[noreturn]] void throw_not_first_statement(const torch::nn::Module& module);
void clear_body_call(const torch::nn::Module& module);
// Keeps `owner`'s hooks on `module` off on this thread while alive. Keeps a view of `owner`:
// its string must outlive the suppression.
class OwnerSuppression {
 public:
  OwnerSuppression(const torch::nn::Module& module, std::string_view owner);
  ~OwnerSuppression();
  OwnerSuppression(const OwnerSuppression&) = delete;
  OwnerSuppression& operator=(const OwnerSuppression&) = delete;
};
std::shared_ptr<torch::nn::Module> keep_alive(torch::nn::Module& module);

// Runs the hooks of one plan around a body, with PyTorch's always_call semantics.
class HookRunner {
 public:
  HookRunner(const HookPlan& plan, ForwardCall& call) : plan_(plan), call_(call) {}
  void run_pre();
  void run_post();
  // After an exception: runs the always_call post-hooks that have not run yet.
  void run_post_after_error(std::exception_ptr error) noexcept;

 private:
  const HookPlan& plan_;
  ForwardCall& call_;
  std::size_t post_done_ = 0;
};

template <class Fn, class... Vs>
class TypedStoredCall final : public StoredCall {
 public:
  // `probe`: the leaves of `args`, flattened (undefined ones when the tensors are not kept).
  TypedStoredCall(std::shared_ptr<torch::nn::Module> module, Fn fn, std::tuple<Vs...> args,
                  bool has_tensors, std::vector<at::Tensor> probe)
      : module_(std::move(module)),
        fn_(std::move(fn)),
        args_(std::move(args)),
        has_tensors_(has_tensors),
        probe_(std::move(probe)) {}

  std::vector<at::Tensor> invoke(const std::vector<at::Tensor>& leaves,
                                 std::string_view suppressed_owner) const override {
    return run</*kOutput=*/true>(leaves, suppressed_owner);
  }
  void rerun(const std::vector<at::Tensor>& leaves,
             std::string_view suppressed_owner) const override {
    run</*kOutput=*/false>(leaves, suppressed_owner);
  }

  std::size_t leaf_count() const override { return probe_.size(); }
  torch::nn::Module& module() const override { return *module_; }

 private:
  // Runs the forward again; returns the output's leaves if kOutput.
  template <bool kOutput>
  std::conditional_t<kOutput, std::vector<at::Tensor>, void> run(
      const std::vector<at::Tensor>& leaves, std::string_view suppressed_owner) const {
    if (leaves.empty() && !has_tensors_ && !probe_.empty()) {
      throw std::invalid_argument(
          "recompose: this call was stored without its tensors; pass the replacement leaves to "
          "invoke()");
    }
    if (!leaves.empty() && leaves.size() != probe_.size()) {
      throw std::invalid_argument("recompose: StoredCall::invoke got " +
                                  std::to_string(leaves.size()) + " tensors for a call with " +
                                  std::to_string(probe_.size()) + " tensor leaves");
    }
    OwnerSuppression off(*module_, suppressed_owner);
    if (leaves.empty()) {
      // A copy (tensors are handles): a forward may take non-const lvalue references.
      std::tuple<Vs...> copy = args_;
      return std::apply([&](Vs&... a) { return call<kOutput>(a...); }, copy);
    }
    LeafCursor cursor(leaves);
    std::tuple<Vs...> rebuilt = std::apply(
        [&](const Vs&... a) { return std::tuple<Vs...>{ArgTraits<Vs>::rebuild(a, cursor)...}; },
        args_);
    return std::apply([&](Vs&... a) { return call<kOutput>(a...); }, rebuilt);
  }

  template <bool kOutput, class... As>
  std::conditional_t<kOutput, std::vector<at::Tensor>, void> call(As&... a) const {
    using R = decltype(fn_(a...));
    if constexpr (!kOutput) {
      (void)fn_(a...);
    } else if constexpr (std::is_void_v<R>) {
      fn_(a...);
      return {};
    } else {
      return output_leaves_of(fn_(a...));
    }
  }

  std::shared_ptr<torch::nn::Module> module_;
  Fn fn_;
  std::tuple<Vs...> args_;
  bool has_tensors_;
  std::vector<at::Tensor> probe_;  // the stored leaves (undefined ones when not kept)
};

template <class Fn, class... Vs>
class TypedCallArguments final : public CallArguments {
 public:
  TypedCallArguments(torch::nn::Module& module, const Fn& fn, const Vs&... args)
      : module_(module), fn_(fn), args_(args...) {}

  std::vector<at::Tensor> leaves() const override {
    std::vector<at::Tensor> out;
    std::apply([&](const Vs&... a) { (ArgTraits<Vs>::flatten(a, out), ...); }, args_);
    return out;
  }

  std::shared_ptr<StoredCall> store(bool keep_tensors) const override {
    std::vector<at::Tensor> probe = leaves();
    if (keep_tensors) {
      std::tuple<Vs...> copy =
          std::apply([](const Vs&... a) { return std::tuple<Vs...>{a...}; }, args_);
      return std::make_shared<TypedStoredCall<Fn, Vs...>>(keep_alive(module_), fn_, std::move(copy),
                                                          true, std::move(probe));
    }
    // Same structure, undefined tensors: holds no memory.
    for (auto& t : probe) t = at::Tensor();
    LeafCursor cursor(probe);
    std::tuple<Vs...> blank = std::apply(
        [&](const Vs&... a) { return std::tuple<Vs...>{ArgTraits<Vs>::rebuild(a, cursor)...}; },
        args_);
    return std::make_shared<TypedStoredCall<Fn, Vs...>>(keep_alive(module_), fn_, std::move(blank),
                                                        false, std::move(probe));
  }

 private:
  torch::nn::Module& module_;
  const Fn& fn_;
  std::tuple<const Vs&...> args_;
};

// The object RECOMPOSE_FORWARD creates at the top of forward.
class ForwardGate {
 public:
  ForwardGate(torch::nn::Module& module, const bool& /*type registered*/)
      : module_(module), intercepts_(plan_forward(module, plan_)) {}

  // Whether this call runs hooks; for the nested body call, first a check that this forward
  // began with the annotation: it must receive the tensors the annotation passed in.
  template <class... Args>
  bool intercepts(const Args&... args) const {
    if (plan_.body_arguments != nullptr) check_body_call(args...);
    return intercepts_;
  }

  // Runs hooks around fn(args...), where fn calls this module's forward again.
  template <class Fn, class... Args>
  decltype(auto) run(Fn fn, Args&... args) {
    static_assert((Flattenable<std::remove_cvref_t<Args>> && ...),
                  "RECOMPOSE_FORWARD: a forward parameter type is not supported; specialise "
                  "recompose::hooks::ArgTraits for it (see recompose/hooks/arg_traits.h)");
    TypedCallArguments<Fn, std::remove_cvref_t<Args>...> view(module_, fn, args...);
    ForwardCall call(module_, view);
    HookRunner runner(plan_, call);
    using R = decltype(fn(args...));
    try {
      runner.run_pre();
      mark_body_call(module_, view);
      if constexpr (std::is_void_v<R>) {
        fn(args...);
        clear_body_call(module_);
        call.set_void_output();
        runner.run_post();
        return;
      } else {
        R out = fn(args...);
        clear_body_call(module_);
        call.set_output(out);
        runner.run_post();
        return out;
      }
    } catch (...) {
      clear_body_call(module_);
      runner.run_post_after_error(std::current_exception());
      throw;
    }
  }

 private:
  template <class... Args>
  void check_body_call(const Args&... args) const {
    std::vector<at::Tensor> received;
    (ArgTraits<std::remove_cvref_t<Args>>::flatten(args, received), ...);
    const std::vector<at::Tensor> passed = plan_.body_arguments->leaves();
    bool same = received.size() == passed.size();
    for (std::size_t i = 0; same && i < received.size(); ++i)
      same = received[i].unsafeGetTensorImpl() == passed[i].unsafeGetTensorImpl();
    if (!same) throw_not_first_statement(module_);
  }

  torch::nn::Module& module_;
  HookPlan plan_;  // declared before intercepts_: filled by its initialiser
  bool intercepts_;
};

}  // namespace recompose::hooks::detail

/// Makes the forward it opens hookable (see the header comment): the FIRST statement of forward,
/// naming every parameter in order. Types its ArgTraits do not support are a compile error; a
/// statement placed before it makes the hooked call throw recompose::CheckpointError.
///
/// Example:
/// ```
/// torch::Tensor forward(torch::Tensor x, std::optional<torch::Tensor> mask, double scale) {
///   RECOMPOSE_FORWARD(x, mask, scale);
///   return attention(x, mask) * scale;
/// }
/// ```
#define RECOMPOSE_FORWARD(...)                                                             \
  if (::recompose::hooks::detail::ForwardGate recompose_forward_gate_{                     \
          *this, ::recompose::hooks::detail::AnnotatedType<                                \
                     std::remove_cvref_t<decltype(*this)>>::registered};                   \
      recompose_forward_gate_.intercepts(__VA_ARGS__))                                     \
  return recompose_forward_gate_.run([this](auto&&... recompose_args_) -> decltype(auto) { \
    return this->forward(std::forward<decltype(recompose_args_)>(recompose_args_)...);     \
  } __VA_OPT__(, ) __VA_ARGS__)
