// The LibTorch versions whose internals the adapters (*_adapter.cpp) were checked against.
// Included only by the adapters: every other file uses LibTorch's public API alone.
#pragma once

#include <torch/headeronly/version.h>

#if !(TORCH_VERSION_MAJOR == 2 && (TORCH_VERSION_MINOR == 10 || TORCH_VERSION_MINOR == 11))
#error "recompose's LibTorch adapters (lib/engine/*_adapter.cpp) support LibTorch 2.10 and 2.11: \
check the internals each adapter names against your version, then extend this guard"
#endif
