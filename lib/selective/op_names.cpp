#include "op_names.h"

#include <algorithm>
#include <stdexcept>

namespace recompose::detail {
namespace {

struct Split {
  std::string name;
  std::optional<std::string> overload;  // "" for ".default"
};

Split split(std::string_view text) {
  const size_t ns = text.find("::");
  if (ns == std::string_view::npos || ns == 0 || ns + 2 >= text.size()) {
    throw std::invalid_argument(
        "recompose: selective checkpoint: op name \"" + std::string(text) +
        "\" has no namespace; write it as the dispatcher does, e.g. \"aten::mm\"");
  }
  Split s;
  const size_t dot = text.find('.', ns + 2);
  s.name = std::string(text.substr(0, dot));
  if (dot != std::string_view::npos) {
    std::string ov(text.substr(dot + 1));
    s.overload = ov == "default" ? std::string() : ov;
  }
  return s;
}

bool any_overload_registered(const std::string& name) {
  auto& dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.findSchema(c10::OperatorName(name, ""))) return true;  // the common case, no scan
  for (const c10::OperatorName& op : dispatcher.getAllOpNames()) {
    if (op.name == name && dispatcher.findSchema(op)) return true;
  }
  return false;
}

}  // namespace

OpRef resolve_op_name(std::string_view text) {
  Split s = split(text);
  OpRef ref{s.name, std::nullopt};
  if (s.overload) {
    ref.overload = c10::Dispatcher::singleton().findSchema(c10::OperatorName(s.name, *s.overload));
    if (!ref.overload) {
      throw std::invalid_argument("recompose: selective checkpoint: unknown op overload \"" +
                                  std::string(text) +
                                  "\": no such operator is registered with the dispatcher");
    }
  } else if (!any_overload_registered(s.name)) {
    throw std::invalid_argument("recompose: selective checkpoint: unknown op \"" +
                                std::string(text) +
                                "\": no operator of that name is registered with the dispatcher");
  }
  return ref;
}

std::vector<std::string> unmatched_op_names(const std::vector<std::string>& names,
                                            const std::vector<std::string>& seen) {
  std::vector<std::string> unmatched;
  for (const std::string& name : names) {
    const bool with_overload = name.find('.') != std::string::npos;
    const bool matched = std::any_of(seen.begin(), seen.end(), [&](const std::string& op) {
      return with_overload ? op == name : op.substr(0, op.rfind('.')) == name;
    });
    if (!matched) unmatched.push_back(name);
  }
  return unmatched;
}

std::optional<c10::OperatorHandle> find_overload(std::string_view text) {
  Split s = split(text);
  return c10::Dispatcher::singleton().findSchema(
      c10::OperatorName(s.name, s.overload.value_or("")));
}

}  // namespace recompose::detail
