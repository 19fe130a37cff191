// How the planner writes byte counts for people: tables, profiles, error messages.
#pragma once

#include <cstdint>
#include <string>

namespace recompose::detail {

// "12.50 MiB"; with `exact`, "12.50 MiB (13107200 bytes)" (error messages, where the exact
// figure matters).
std::string format_mib(int64_t bytes, bool exact = false);

}  // namespace recompose::detail
