// Debug mode: the names of the ATen ops that ran on this thread while a trace was alive
// (captured with at::RecordFunction), so that a determinism error can list the ops of the
// original forward next to those of the recomputation.
#pragma once

#include <ATen/record_function.h>

#include <memory>
#include <string>
#include <vector>

namespace recompose::detail {

class OpTrace {
 public:
  // Starts recording into `ops`, which must outlive the trace.
  explicit OpTrace(std::shared_ptr<std::vector<std::string>> ops);
  ~OpTrace();
  OpTrace(const OpTrace&) = delete;
  OpTrace& operator=(const OpTrace&) = delete;

 private:
  std::shared_ptr<std::vector<std::string>> ops_;
  at::CallbackHandle handle_;
};

// "  1. aten::mm\n  2. ..." for an error message.
std::string format_ops(const std::vector<std::string>& ops);

}  // namespace recompose::detail
