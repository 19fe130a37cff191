// Tensor accounting shared by the meter, offload's report, the planner's profiler and
// inspect_policy: what counts as a parameter, the bytes of distinct storages, an op's printed
// name.
//
// Parameters (and views of them, such as the transposed weight a linear layer saves) are held by
// the model anyway: they are no activations, for what a SavedTensorMeter counts and for what an
// offload reports it could not move.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <set>
#include <string>

namespace recompose::detail {

inline bool is_parameter_like(const at::Tensor& t) {
  const at::Tensor base = t.is_view() ? at::Tensor(t._base()) : t;
  return base.is_leaf() && base.requires_grad();
}

// Calls `fn` on each tensor of `values` (tensors, tensor lists, lists holding tensors).
template <class Fn>
void for_each_tensor(c10::ArrayRef<c10::IValue> values, Fn fn) {
  for (const auto& v : values) {
    if (v.isTensor()) {
      fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) fn(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) {
        if (e.isTensor()) fn(e.toTensor());
      }
    }
  }
}

// Bytes of the distinct storages of the tensors in `values` (tensors, tensor lists, lists holding
// tensors), each storage once; with skip_parameter_like, parameters and views of them left out,
// as SavedTensorMeter counts.
inline int64_t distinct_storage_bytes(c10::ArrayRef<c10::IValue> values, bool skip_parameter_like) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    if (skip_parameter_like && is_parameter_like(t)) return;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for_each_tensor(values, add);
  return bytes;
}

// "name.overload", "default" for the overload without a name: "aten::mm.default".
inline std::string overload_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.name + "." + (name.overload_name.empty() ? "default" : name.overload_name);
}

}  // namespace recompose::detail
