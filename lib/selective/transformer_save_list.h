// The ops transformer_policy() keeps (MUST_SAVE), as overload names ("aten::mm.default"): the
// compute-intensive ops of torchtitan's _save_list. One list, used by the policy and by the
// memory planner, which offers what the policy keeps as a candidate configuration.
#pragma once

#include <span>
#include <string_view>

namespace recompose::detail {

std::span<const std::string_view> transformer_save_list();

}  // namespace recompose::detail
