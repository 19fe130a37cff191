// KeptReason: why swap or offload left a saved tensor on the device, or why a selective region
// keeps more than its policy's outputs. One list for the rules that decide it
// (lib/swap/eligibility.cpp, lib/selective/parameter_casts.h), the events that report it and the
// readers that print it (the step ledger).
#pragma once

#include <cstdint>

namespace recompose::events {

enum class KeptReason : uint8_t {
  BelowMinBytes,         // smaller than SwapOptions::min_bytes (or empty)
  Parameter,             // a parameter or a view of one: the module keeps it anyway
  PartOfLargerStorage,   // a slice or broadcast: its storage outlives the offload
  NotSupported,          // not strided, nested, quantized, meta, conjugate or negative view
  RejectedByFilter,      // SwapOptions::filter said no
  Policy,                // apply_offload's ActivationPolicy::SAVE
  OverCopyWindow,        // never-stall: its copy would not fit the window that hides it
  AskedForBeforeItLeft,  // apply_offload's last call (keep_last_on_device): backward wants it now
  // Selective checkpointing, beyond the policy's outputs: what the region keeps so that its replay
  // does not run the op again (lib/selective/parameter_casts.h, dropout_draw.h).
  ParameterCastForReplay,  // autocast's casts of parameters, within the policy's budget
  DrawForReplay,           // dropout's draws (bits on CPU, the bool mask on CUDA)
};

// The reason as the ledger prints it: "below min_bytes", "parameter", ...
const char* to_string(KeptReason reason);

}  // namespace recompose::events
