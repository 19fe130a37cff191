// Locks over module state, per set of buffers and modules, instead of one for the process.
//
// Note [ Module state locks ]
// A recomputation points a module's buffer TensorImpls at the forward's values and sets the
// modules' train/eval modes to the forward's (ModuleStateSnapshot::RecomputeScope), for as long
// as the user's forward runs again. Both are visible to every thread using those modules, so two
// threads must not do it to the same module at once, and a thread copying a buffer at a region's
// entry must not read it while another thread's recomputation has it pointed elsewhere. Threads
// over different modules (a model replica per thread, the layers of a pipeline) have nothing to
// share and must not wait for each other.
//
// 1. The state is locked per object: a buffer by its TensorImpl, a module whose mode changes by
//    its address. A scope takes the keys of its objects, each once, and holds them until it ends
//    (for a recomputation: across the user's forward). Scopes over disjoint objects never wait
//    for each other (no striping: a table of held keys, consulted under a short internal mutex).
// 2. Keys are taken in increasing address, so threads that block never wait in a cycle: a thread
//    blocks on a key only when it holds no key above it.
// 3. A thread nests scopes (a recomputation that enters or recomputes another region). Keys it
//    already holds are counted again, not taken again. A nested scope whose modules lie within
//    the outer one's needs nothing more. One that needs a new key below one it holds (a
//    checkpoint(fn) reaching modules outside the enclosing region's tree) cannot block without
//    risking a cycle: it waits a bounded time and then fails with a CheckpointError that names
//    the cause (two threads recomputing overlapping modules in opposite nesting), instead of
//    hanging.
// 4. Scopes end on the thread that began them, in reverse order (they live on its stack).
#pragma once

#include <c10/util/SmallVector.h>

#include <chrono>

namespace recompose::detail {

// Holds `keys` (addresses of buffers' TensorImpls and of modules) while alive.
// See Note [ Module state locks ].
class ModuleStateLocks {
 public:
  ModuleStateLocks() = default;
  // Takes `keys` (repeats allowed); throws CheckpointError where rule 3 gives up.
  explicit ModuleStateLocks(const c10::SmallVector<const void*, 16>& keys);
  ~ModuleStateLocks();
  ModuleStateLocks(ModuleStateLocks&& other) noexcept;
  ModuleStateLocks& operator=(ModuleStateLocks&& other) noexcept;
  ModuleStateLocks(const ModuleStateLocks&) = delete;
  ModuleStateLocks& operator=(const ModuleStateLocks&) = delete;

  bool empty() const { return keys_.empty(); }

 private:
  void release();
  c10::SmallVector<const void*, 16> keys_;  // increasing, each once
};

// Rule 3's bound on an out-of-order wait (60 s unless set); tests shorten it. Returns the
// previous bound.
std::chrono::milliseconds set_out_of_order_patience(std::chrono::milliseconds patience);

}  // namespace recompose::detail
