// Op names as users write them ("aten::mm", "aten::max.dim", "aten::max.default"), checked
// against the dispatcher's registry.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace recompose::detail {

struct OpRef {
  std::string name;                             // "aten::max"
  std::optional<c10::OperatorHandle> overload;  // set when one overload was named
};

// Throws std::invalid_argument naming `text` if it has no namespace, or if no op of that name
// (or no such overload) is registered.
OpRef resolve_op_name(std::string_view text);

// The op named by `text` exactly ("ns::name" is the overload without a name, as
// "ns::name.default"), or nullopt if it is not registered. Never throws for a missing op.
std::optional<c10::OperatorHandle> find_overload(std::string_view text);

// The names of a save list (as users write them) that match none of `seen`, ops as
// overload_name() prints them ("aten::max.dim", "aten::mm.default"): a name with an overload
// names that overload, one without names every overload.
std::vector<std::string> unmatched_op_names(const std::vector<std::string>& names,
                                            const std::vector<std::string>& seen);

}  // namespace recompose::detail
