// Precompiled header for the library targets: the LibTorch headers they need, no more. Not used
// in unity builds (meson.build), where each library compiles in a few translation units.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
