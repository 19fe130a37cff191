// Twin modules: modules of a profile that do the same work (same type, calls and input bytes, and
// the same ops with the same output bytes, in the same order: the identical blocks of a
// transformer or a ResNet stage; their saved bytes may differ, as a block's input that the block
// before saved is counted there). One profiled step measures each module once, and what a single
// measurement picks up besides the module's own cost (a cold allocator and caches in the first
// block, a preempted thread, a device queue that drained) differs from twin to twin and from run to
// run: a ResNet's two identical first blocks were estimated 6.7 ms and 12.4 ms of extra time, and
// the plan changed between runs. Twins are repeats of one measurement, so the solver gives each
// twin the fastest time its group measured, per time of the profile (forward, intercepted forward,
// replay, each op): noise only ever adds time, so the least of the repeats is the estimate closest
// to the cost. (Giving twins their median instead made a H100 plan slower: the median keeps the
// noise of the typical twin.) Backward times are the exception: the group's median
// (twin_modules.cpp says why).
#pragma once

#include <recompose/memory_profile.h>

namespace recompose::detail {

// `profile` with the times of each group of twin modules replaced by the group's least (backward:
// its median).
MemoryProfile with_twins_at_their_fastest(MemoryProfile profile);

}  // namespace recompose::detail
