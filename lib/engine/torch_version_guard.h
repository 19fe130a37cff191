// The LibTorch versions whose internals the engine's adapters (*_adapter.cpp) were checked
// against. Included only by the adapters: every other file uses LibTorch's public API alone.
// Each adapter stops the build with an #error naming itself and the internals to check when
// RECOMPOSE_TORCH_VERSION_CHECKED is 0.
#pragma once

#include <torch/headeronly/version.h>

#if TORCH_VERSION_MAJOR == 2 && (TORCH_VERSION_MINOR == 10 || TORCH_VERSION_MINOR == 11)
#define RECOMPOSE_TORCH_VERSION_CHECKED 1
#else
#define RECOMPOSE_TORCH_VERSION_CHECKED 0
#endif
