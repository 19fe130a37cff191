// The LibTorch versions whose internals the adapters were checked against, one range for all:
// lib/engine/engine_adapter.cpp, device_adapter.cpp, dispatch_keys_adapter.cpp,
// cpu_generator_adapter.cpp, autograd_sequence_adapter.cpp, region_inputs_adapter.cpp and
// lib/selective/dispatch_interceptor.cpp. Included only by them: every other file uses LibTorch's
// public API alone. Each adapter stops the build with an #error naming itself and the internals
// to check when RECOMPOSE_TORCH_VERSION_CHECKED is 0. Extending the range: check those internals
// in the new version's headers, add it to scripts/torch-versions.sh and run
// `bash scripts/test-versions.sh <version>`. See Note [ Adapters ].
#pragma once

#include <torch/headeronly/version.h>

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10 && TORCH_VERSION_MINOR <= 15
#define RECOMPOSE_TORCH_VERSION_CHECKED 1
#else
#define RECOMPOSE_TORCH_VERSION_CHECKED 0
#endif
