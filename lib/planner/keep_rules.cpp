#include "keep_rules.h"

#include "selective/transformer_save_list.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace recompose::detail {
namespace {

// An op that only allocates (empty_like: dropout's noise before bernoulli_ draws into it) makes no
// value worth keeping; the draw written into it is random, so its entry would keep a copy of the
// uninitialised memory, and the replay would still write the draw back and divide.
bool allocates_only(const OpProfile& o) {
  return o.op.rfind("aten::empty", 0) == 0 || o.op.rfind("aten::new_empty", 0) == 0;
}

bool kept_by_transformer_policy(const std::string& op) {
  return std::ranges::find(transformer_save_list(), std::string_view(op)) !=
         transformer_save_list().end();
}

}  // namespace

bool keepable(const OpProfile& o) {
  return (!o.mutated || o.carries_write) && !o.inplace && !o.view && !allocates_only(o);
}

bool swappable(const OpProfile& o) { return keepable(o) && !o.mutated; }

std::vector<bool> transformer_keep_set(const ModuleProfile& m, bool every_second) {
  std::vector<bool> keep(m.ops.size(), false);
  for (size_t k = 0; k < m.ops.size(); ++k) {
    const OpProfile& o = m.ops[k];
    keep[k] = keepable(o) && kept_by_transformer_policy(o.op) &&
              !(every_second && o.op == "aten::mm.default" && o.call_index % 2 == 1);
  }
  return keep;
}

}  // namespace recompose::detail
