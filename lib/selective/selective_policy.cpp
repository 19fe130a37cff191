// SelectivePolicy: from a callable, or from a list of op names validated against the dispatcher.
// Also defines CheckpointOptions::policy(const SelectivePolicy&).

#include "op_names.h"
#include "op_traits.h"

#include <recompose/checkpoint_options.h>
#include <recompose/selective_checkpoint.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace recompose {
namespace {

// Ops to save, by name (every overload) or by resolved overload. Asked once per op of a region:
// names are matched by the hash OpTraits keeps per operator, and compared only when it matches.
struct SaveList {
  struct Name {
    std::string name;
    size_t hash;
  };
  std::vector<Name> any_overload;
  std::vector<c10::OperatorHandle> overloads;

  bool contains(const c10::OperatorHandle& op) const {
    for (const c10::OperatorHandle& h : overloads) {
      if (h == op) return true;
    }
    if (any_overload.empty()) return false;
    const size_t hash = detail::OpTraits::of(op).name_hash;
    for (const Name& n : any_overload) {
      if (n.hash == hash && n.name == op.operator_name().name) return true;
    }
    return false;
  }
};

// Whether naming the overload can mean anything. Not for ignored ops (detach, metadata), nor
// for in-place and out= ops, whose kept result would not write into the recomputed input. Views
// may be named, as in PyTorch: they are recomputed, which gives the values keeping them would
// give and keeps no base alive.
bool may_be_named(const c10::OperatorHandle& op) {
  const detail::OpTraits& traits = detail::OpTraits::of(op);
  return !traits.ignored && (!traits.returns_alias || traits.view);
}

// A composite op (aten::linear, aten::conv2d): its CompositeImplicitAutograd kernel runs above
// autograd and calls the ops it is made of, which are what a policy sees.
bool decomposes_before_policies(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

// What common composite ops reach a policy as, for the error that names them.
std::string seen_as(const std::string& name) {
  static const std::pair<const char*, const char*> known[] = {
      {"aten::linear",
       "aten::addmm or aten::mm (aten::matmul's, with aten::_unsafe_view, on 3-d inputs)"},
      {"aten::matmul", "aten::mm or aten::bmm"},
      {"aten::conv1d", "aten::convolution"},
      {"aten::conv2d", "aten::convolution"},
      {"aten::conv3d", "aten::convolution"},
      {"aten::dropout", "aten::native_dropout (CUDA) or aten::bernoulli_ (CPU)"},
      {"aten::layer_norm", "aten::native_layer_norm"},
      {"aten::batch_norm", "aten::native_batch_norm"},
      {"aten::softmax", "aten::_softmax"},
      {"aten::scaled_dot_product_attention",
       "aten::_scaled_dot_product_flash_attention, _efficient_attention, _cudnn_attention or, on "
       "CPU, _scaled_dot_product_flash_attention_for_cpu or aten::bmm and aten::_softmax"},
      {"aten::rrelu", "aten::rrelu_with_noise"},
  };
  for (const auto& [composite, ops] : known) {
    if (name == composite) return std::string(" (here: ") + ops + ")";
  }
  return "";
}

// Naming only overloads that may not be named would silently save nothing.
void check_keepable(const std::string& name, const detail::OpRef& ref) {
  bool keepable = false, composite = false;
  auto consider = [&](const c10::OperatorHandle& op) {
    if (decomposes_before_policies(op)) {
      composite = true;
    } else {
      keepable = keepable || may_be_named(op);
    }
  };
  if (ref.overload) {
    consider(*ref.overload);
  } else {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& op : dispatcher.getAllOpNames()) {
      if (op.name != ref.name) continue;
      if (auto handle = dispatcher.findSchema(op)) consider(*handle);
    }
  }
  if (!keepable && composite) {  // aten::linear: its out= overload cannot be kept either
    throw std::invalid_argument(
        "recompose: selective checkpoint: \"" + name +
        "\" is a composite op: it is made of other ops before autograd runs, and a policy sees "
        "only those" +
        seen_as(ref.name) +
        ", so naming it would save nothing. Name the ops it is made of; "
        "recompose::inspect_policy(policy, module, input) lists the ops a region runs.");
  }
  if (!keepable) {
    throw std::invalid_argument(
        "recompose: selective checkpoint: \"" + name +
        "\" can never be saved: selective checkpointing always recomputes in-place and out= "
        "ops and ignores detach and metadata ops (aten::size, ...); name the op that "
        "computes the values instead");
  }
}

PolicyFn policy_from_names(const std::vector<std::string>& names) {
  auto list = std::make_shared<SaveList>();
  for (const std::string& name : names) {
    detail::OpRef ref = detail::resolve_op_name(name);  // throws std::invalid_argument
    check_keepable(name, ref);
    if (ref.overload) {
      list->overloads.push_back(*ref.overload);
    } else {
      const size_t hash = std::hash<std::string>{}(ref.name);
      list->any_overload.push_back({std::move(ref.name), hash});
    }
  }
  return [list](const SelectiveCheckpointContext&, const c10::OperatorHandle& op,
                const torch::jit::Stack&) {
    return list->contains(op) ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
  };
}

}  // namespace

SelectivePolicy::SelectivePolicy(PolicyFn fn) : fn_(std::move(fn)) {
  if (!fn_) throw std::invalid_argument("recompose: SelectivePolicy: the policy function is empty");
}

SelectivePolicy::SelectivePolicy(const std::vector<std::string>& save_ops)
    : fn_(policy_from_names(save_ops)), op_names_(save_ops) {}

SelectivePolicy::SelectivePolicy(std::initializer_list<const char*> save_ops)
    : SelectivePolicy(std::vector<std::string>(save_ops.begin(), save_ops.end())) {}

CheckpointOptions& CheckpointOptions::policy(const SelectivePolicy& p) {
  policy_ = std::make_shared<const SelectivePolicy>(p);
  return *this;
}

SelectivePolicy& SelectivePolicy::keep_parameter_casts(double budget) {
  if (!(budget >= 0)) {
    throw std::invalid_argument(
        "recompose::SelectivePolicy::keep_parameter_casts: the budget is a fraction of what the "
        "region would hold without checkpointing, 0 or more (0 keeps no cast); got " +
        std::to_string(budget));
  }
  parameter_cast_budget_ = budget;
  return *this;
}

}  // namespace recompose
