#include "engine/op_trace.h"

#include <range/v3/view/enumerate.hpp>

#include <sstream>

namespace recompose::detail {
namespace {
// The thread's innermost trace target; RecordFunction callbacks cannot carry a pointer of ours.
thread_local std::vector<std::vector<std::string>*> tl_targets;
}  // namespace

OpTrace::OpTrace(std::shared_ptr<std::vector<std::string>> ops) : ops_(std::move(ops)) {
  tl_targets.push_back(ops_.get());
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                     -> std::unique_ptr<at::ObserverContext> {
        if (!tl_targets.empty() && tl_targets.back() != nullptr)
          tl_targets.back()->emplace_back(fn.name());
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
}

OpTrace::~OpTrace() {
  at::removeCallback(handle_);
  tl_targets.pop_back();
}

std::string format_ops(const std::vector<std::string>& ops) {
  std::ostringstream out;
  for (const auto& [i, op] : ops | ranges::views::enumerate)
    out << "  " << (i + 1) << ". " << op << "\n";
  if (ops.empty()) out << "  (none)\n";
  return out.str();
}

}  // namespace recompose::detail
