// Precompiled header for the library targets: the LibTorch headers they need, no more.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
