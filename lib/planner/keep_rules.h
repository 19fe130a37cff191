// What a selective configuration may do with each op of a module's profile: keep its outputs on
// the device, or swap them to host memory; and what transformer_policy keeps. One set of rules for
// the solver's candidates, the fixed presets and the pricing of swaps (module_pricing.h).
#pragma once

#include <recompose/memory_profile.h>

#include <vector>

namespace recompose::detail {

// Kept on the device: an output written in place later only if it carries the write (nothing read
// it before; a copy of the value before the write would cost bytes the profile does not count);
// never an op that only allocates.
bool keepable(const OpProfile& op);

// Offloaded: a keepable op whose output is never written later (an offloaded output carries no
// write).
bool swappable(const OpProfile& op);

// Per op of `module`, whether transformer_policy keeps it (its own list, keepable ops only);
// `every_second`: with every second aten::mm recomputed
// (TransformerPolicyOptions::recompute_every_second_mm). Beyond these ops, transformer_policy's
// regions keep dropout's draws, which every selective candidate is charged
// (ModuleProfile::draw_bytes), and under autocast parameter casts within its budget
// (lib/selective/parameter_casts.h), which the planner's candidate does not: a plan applies it as
// a save list, which keeps no cast, so its bytes are what that plan holds.
std::vector<bool> transformer_keep_set(const ModuleProfile& module, bool every_second);

}  // namespace recompose::detail
