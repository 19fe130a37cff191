// KeptReason: why swap or offload left a saved tensor on the device. One list for the swap rules
// that decide it (lib/swap/eligibility.cpp), the events that report it and the readers that print
// it (the step ledger).
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
};

// The reason as the ledger prints it: "below min_bytes", "parameter", ...
const char* to_string(KeptReason reason);

}  // namespace recompose::events
