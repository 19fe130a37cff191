// The dispatch keys through which ops reach an interceptor: recompose's (kInterceptKey, the
// selective interceptor's fallback; See Note [ Interception without a dispatch mode ]) and
// LibTorch's dispatch modes (Python, PythonTLSSnapshot). InternalOpsGuard excludes them all to hide
// recompose's own ops from every interceptor (See Note [ Internal ops ]).
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>

namespace recompose::detail {

// An out-of-tree key LibTorch never uses, just above Python: see
// lib/selective/dispatch_interceptor.cpp.
inline constexpr c10::DispatchKey kInterceptKey = c10::DispatchKey::Fake;

inline constexpr c10::DispatchKeySet kModeKeys({kInterceptKey, c10::DispatchKey::Python,
                                                c10::DispatchKey::PythonTLSSnapshot});

}  // namespace recompose::detail
