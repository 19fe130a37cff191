// Precompiled header for the targets with several sources that use the whole C++ frontend
// (test_checkpoint, gpt, sharded_trainer; in unity builds test_checkpoint alone, meson.build). GCC
// writes one ~700 MB file per target that uses it, and it only pays where several translation
// units share it: single-source targets go without.
#include <torch/torch.h>
