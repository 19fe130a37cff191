#include "swap/eligibility.h"

#include <cstdint>
#include <stdexcept>

namespace recompose::detail {

std::string unsupported_for_swap(const at::Tensor& tensor) {
  if (!tensor.defined()) return "it is undefined";
  if (tensor.layout() != c10::kStrided) return "its layout is not strided";
  if (tensor.is_nested()) return "it is a nested tensor";
  if (tensor.is_quantized()) return "it is quantized";
  if (tensor.is_meta()) return "it is on the meta device";
  if (tensor.unsafeGetTensorImpl()->has_storage() == false) return "it has no storage";
  return "";
}

bool worth_offloading(const at::Tensor& tensor, const SwapOptions& options) {
  return !kept_reason(tensor, options).has_value();
}

std::optional<events::KeptReason> kept_reason(const at::Tensor& tensor,
                                              const SwapOptions& options) {
  using events::KeptReason;
  if (!unsupported_for_swap(tensor).empty()) return KeptReason::NotSupported;
  // Parameters and their views: the module keeps them anyway (whatever their size).
  if (tensor.is_leaf() && tensor.requires_grad()) return KeptReason::Parameter;
  if (tensor.is_view()) {
    const auto& base = tensor._base();
    if (base.is_leaf() && base.requires_grad()) return KeptReason::Parameter;
  }
  const auto nbytes = static_cast<int64_t>(tensor.nbytes());
  if (nbytes == 0 || nbytes < options.min_bytes()) return KeptReason::BelowMinBytes;
  // Slices and broadcasts: the storage outlives the offload, so nothing would be freed.
  if (!tensor.is_non_overlapping_and_dense()) return KeptReason::PartOfLargerStorage;
  if (static_cast<int64_t>(tensor.storage().nbytes()) != nbytes)
    return KeptReason::PartOfLargerStorage;
  if (tensor.is_conj() || tensor.is_neg()) return KeptReason::NotSupported;
  if (options.filter() && !options.filter()(tensor)) return KeptReason::RejectedByFilter;
  return std::nullopt;
}

SwapOptions check_swap_options(SwapOptions options) {
  // Options are arguments: a bad one is std::invalid_argument, naming it and what it means.
  auto at_least = [](const char* name, int64_t value, int64_t least, const char* meaning) {
    if (value >= least) return;
    throw std::invalid_argument(std::string("recompose: SwapOptions: ") + name +
                                " must be >= " + std::to_string(least) + " (" + meaning +
                                "), got " + std::to_string(value));
  };
  at_least("min_bytes", options.min_bytes(), 0, "0 offloads every eligible tensor");
  at_least("prefetch_groups", options.prefetch_groups(), 0, "0 loads each group on demand");
  at_least("implicit_group_bytes", options.implicit_group_bytes(), 0,
           "0 gives each tensor outside explicit groups a group of its own");
  at_least("max_pool_bytes", options.max_pool_bytes(), -1, "-1 for no limit, 0 for no pool");
  at_least("max_groups_in_flight", options.max_groups_in_flight(), 0, "0 for no limit");
  return options;
}

}  // namespace recompose::detail
