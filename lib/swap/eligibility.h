// Which tensors a SwapManager offloads (see recompose/swap.h, "What stays on the device").
#pragma once

#include "events/kept_reason.h"

#include <recompose/swap.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace recompose::detail {

// Why `tensor` cannot be offloaded at all (undefined, not strided, nested, quantized, meta, no
// storage), or "" if it can.
std::string unsupported_for_swap(const at::Tensor& tensor);

// Whether offloading `tensor` frees device memory worth a copy under `options`: supported, at
// least min_bytes, no parameter or view of one, covering its whole storage, accepted by the
// filter.
bool worth_offloading(const at::Tensor& tensor, const SwapOptions& options);

// Why `tensor` is not worth offloading under `options` (BelowMinBytes, Parameter,
// PartOfLargerStorage, NotSupported, RejectedByFilter), or nothing if it is; the filter is asked
// last, once. worth_offloading is this returning nothing: one rule.
std::optional<events::KeptReason> kept_reason(const at::Tensor& tensor, const SwapOptions& options);

// `options`, or std::invalid_argument naming the first option out of range (SwapManager::create).
SwapOptions check_swap_options(SwapOptions options);

}  // namespace recompose::detail
