// The warning a selective region gives when its policy kept nothing (selective_contexts.cpp):
// said once per kind of region, for the first few kinds of a process.
#pragma once

namespace recompose::detail {

// Forgets which kinds of region were warned about (for tests, which each expect their warning).
void reset_kept_nothing_warnings();

}  // namespace recompose::detail
