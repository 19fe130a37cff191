// Hooks and attached state live as long as their module.
//
// LibTorch modules have no destructor hook and no slot for user data, so recompose keeps hooks
// and state in a side table keyed by module address, with a weak reference to each module. When
// a module is destroyed its entry is left behind until the next purge, which destroys its hooks'
// callables and its attached states (and with them whatever they hold: a SwapManager's pinned
// pool, options, ...). A purge happens:
//   - at every registry operation: register_forward_pre_hook, register_forward_hook,
//     HookHandle::remove, hook_count, attach_state, find_state, detach_state, applied_apis;
//   - on the forward of any annotated module, once every kForwardPurgePeriod such forwards on a
//     thread (while the table is not empty);
//   - when purge_expired() is called.
// When the last entry is gone, a forward of an annotated module costs one atomic read again.
// A dead module's entry is never seen by a new module that happens to get the same address, even
// before it is purged: its hooks do not run and its state is not found. Until the purge, the
// entry's weak reference also keeps the storage of a module made by std::make_shared allocated
// (its members are already destroyed). A module is not dead while something still owns it: a
// checkpointed module is owned by the autograd graphs that may recompute it, until they are freed.
//
//   {
//     Block block;
//     recompose::apply_checkpoint(*block, opts);  // attaches hooks and state
//   }                                             // block destroyed; its state not yet
//   recompose::hooks::purge_expired();            // now its state and hooks are destroyed
#pragma once

#include <cstddef>

namespace recompose::hooks {

/// A forward of an annotated module purges, on its thread, at least once every this many calls.
inline constexpr unsigned kForwardPurgePeriod = 64;

/// Destroys, now and on this thread, the hooks and attached states of every module that has been
/// destroyed; use it to free what they hold (pinned host memory, for instance) at a known point.
/// Returns how many modules' entries were purged. Thread-safe, also from a hook or from a state's
/// destructor; cheap when nothing is to purge (one pass over the table under a shared lock).
/// Throws only std::bad_alloc.
///
/// Example:
/// ```
/// model = nullptr;                              // the checkpointed blocks die
/// auto n = recompose::hooks::purge_expired();  // their swap pools are released here
/// ```
std::size_t purge_expired();

}  // namespace recompose::hooks
