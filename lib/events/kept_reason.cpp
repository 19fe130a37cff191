#include "events/kept_reason.h"

namespace recompose::events {

const char* to_string(KeptReason reason) {
  switch (reason) {
    case KeptReason::BelowMinBytes:
      return "below min_bytes";
    case KeptReason::Parameter:
      return "parameter";
    case KeptReason::PartOfLargerStorage:
      return "part of a larger storage";
    case KeptReason::NotSupported:
      return "not supported";
    case KeptReason::RejectedByFilter:
      return "rejected by the filter";
    case KeptReason::Policy:
      return "policy";
    case KeptReason::OverCopyWindow:
      return "over the copy window";
    case KeptReason::AskedForBeforeItLeft:
      return "asked for before it left";
    case KeptReason::ParameterCastForReplay:
      return "parameter cast for the replay";
    case KeptReason::DrawForReplay:
      return "dropout draw for the replay";
  }
  return "unknown";
}

}  // namespace recompose::events
