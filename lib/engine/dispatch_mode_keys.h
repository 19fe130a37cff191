// The dispatch keys through which LibTorch hands ops to a dispatch mode: what selective
// checkpointing's interceptor enters by, and what InternalOpsGuard excludes to hide recompose's
// own ops from every mode (See Note [ Internal ops ]).
#pragma once

#include <c10/core/DispatchKeySet.h>

namespace recompose::detail {

inline constexpr c10::DispatchKeySet kModeKeys({c10::DispatchKey::Python,
                                                c10::DispatchKey::PythonTLSSnapshot});

}  // namespace recompose::detail
