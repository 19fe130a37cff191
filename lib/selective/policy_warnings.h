// The warnings a selective region gives at the end of its forward when its policy kept nothing,
// or kept more bytes than no checkpointing would hold (policy_warnings.cpp): each said once
// per kind of region, for the first few kinds of a process.
#pragma once

namespace recompose::detail {

// While alive, selective regions entered on this thread give no policy warning (inspect_policy
// runs the region itself and reports the same findings its own way).
class PolicyWarningsOff {
 public:
  PolicyWarningsOff();
  ~PolicyWarningsOff();
  PolicyWarningsOff(const PolicyWarningsOff&) = delete;
  PolicyWarningsOff& operator=(const PolicyWarningsOff&) = delete;

 private:
  bool was_off_;
};

// Forgets which kinds of region were warned about (for tests, which each expect their warning).
void reset_policy_warnings();

}  // namespace recompose::detail
