// Precompiled header for tests and examples, which use the whole C++ frontend.
#include <torch/torch.h>
