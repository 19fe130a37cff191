#include "ignored_ops.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

namespace recompose::detail {
namespace {

// Every overload of these ops (upstream lists the default overloads; the others are metadata
// queries too).
const std::unordered_set<std::string>& ignored_names() {
  static const std::unordered_set<std::string> names{
      "aten::detach",
      "prim::device",
      "aten::is_contiguous",
      "aten::is_strides_like_format",
      "aten::is_non_overlapping_and_dense",
      "aten::size",
      "aten::sym_size",
      "aten::stride",
      "aten::sym_stride",
      "aten::storage_offset",
      "aten::sym_storage_offset",
      "aten::numel",
      "aten::sym_numel",
      "aten::dim",
  };
  return names;
}

// Resolved once: comparing handles is a pointer compare, cheaper than hashing names per op.
const std::vector<c10::OperatorHandle>& ignored_handles() {
  static const std::vector<c10::OperatorHandle> handles = [] {
    std::vector<c10::OperatorHandle> out;
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (!ignored_names().contains(name.name)) continue;
      if (auto op = dispatcher.findOp(name)) out.push_back(*op);
    }
    // aten::detach first: by far the most frequent of them.
    std::stable_partition(out.begin(), out.end(), [](const c10::OperatorHandle& h) {
      return h.operator_name().name == "aten::detach";
    });
    return out;
  }();
  return handles;
}

}  // namespace

bool is_sac_ignored(const c10::OperatorHandle& op) {
  for (const c10::OperatorHandle& h : ignored_handles()) {
    if (h == op) return true;
  }
  return false;
}

bool is_autocast_cacheable_cast(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  static const c10::OperatorHandle to_copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "");
  if (op != to_copy) return false;
  // _to_copy(Tensor self, *, ScalarType? dtype, ...): the condition of autocast's cached_cast.
  const size_t n_args = op.schema().arguments().size();
  const c10::IValue& self = stack[stack.size() - n_args];
  const c10::IValue& dtype = stack[stack.size() - n_args + 1];
  if (!self.isTensor() || dtype.isNone()) return false;
  const at::Tensor& t = self.toTensor();
  const auto to = dtype.toScalarType();
  return t.defined() && t.scalar_type() == at::kFloat && (to == at::kBFloat16 || to == at::kHalf) &&
         t.requires_grad() && t.is_leaf() && !t.is_view();
}

bool returns_alias(const c10::OperatorHandle& op) {
  for (const c10::Argument& ret : op.schema().returns()) {
    if (ret.alias_info() != nullptr) return true;
  }
  return false;
}

}  // namespace recompose::detail
