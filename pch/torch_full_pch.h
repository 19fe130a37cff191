// Precompiled header for tests and examples, which use the whole C++ frontend.
#pragma once
#include <torch/torch.h>
