// Precompiled header for the targets with several sources that use the whole C++ frontend
// (test_checkpoint, gpt, sharded_trainer). GCC writes one ~700 MB file per target that uses it,
// and it only pays where several sources share it: single-source targets go without.
#include <torch/torch.h>
