// Counts the calls of one op by name ("aten::clone") while alive, through RecordFunction: it sees
// what no interceptor sees, the selective replay's ops included. The callback is thread-local but
// travels with the thread-local state into autograd's device threads (CUDA backward), so the
// count is one atomic for every thread that carries it. Each call may be seen at several dispatch
// levels: compare counts with zero, or before/after, not with a number of source-level calls.
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace rt {

class OpCallCounter {
 public:
  explicit OpCallCounter(const char* name) {
    name_.store(name);
    count_.store(0);
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          const char* wanted = name_.load();
          if (wanted != nullptr && std::strcmp(fn.name(), wanted) == 0) count_.fetch_add(1);
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCallCounter() {
    at::removeCallback(handle_);
    name_.store(nullptr);
  }
  OpCallCounter(const OpCallCounter&) = delete;
  OpCallCounter& operator=(const OpCallCounter&) = delete;
  int64_t calls() const { return count_.load(); }

 private:
  // One counter at a time in a process (the tests run one case at a time).
  static inline std::atomic<const char*> name_{nullptr};
  static inline std::atomic<int64_t> count_{0};
  at::CallbackHandle handle_;
};

}  // namespace rt
