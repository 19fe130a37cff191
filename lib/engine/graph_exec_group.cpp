// GraphExecGroup: which graph tasks share recomputations. A thread-local says which group is
// open on the user's thread; the engine adapter tells us each graph task as it starts there, and
// the table below lets the engine's device threads, where CUDA backward unpacks, find the group.
#include "engine/current_graph_task.h"

#include <recompose/checkpoint_error.h>
#include <recompose/graph_exec_group.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace recompose {
namespace detail {
namespace {

struct GroupTable {
  std::mutex mutex;
  std::unordered_map<int64_t, int64_t> group_of_task;                // graph task id -> group key
  std::unordered_map<int64_t, std::vector<int64_t>> tasks_of_group;  // for cleanup
};

GroupTable& table() {
  static auto* t = new GroupTable();  // leaked: device threads may ask during static destruction
  return *t;
}

// Groups alive in the process: with none, unpacking never takes the table's lock.
std::atomic<int64_t> groups_alive{0};

// Keys that are no graph task id (those count up from 0): groups and by-hand unpacks.
int64_t fresh_key() {
  static std::atomic<int64_t> next{-2};
  return next.fetch_sub(1);
}

thread_local int64_t open_group = 0;  // 0: none (keys are negative)

std::optional<int64_t> group_of_task(int64_t task) {
  if (task < 0 || groups_alive.load(std::memory_order_acquire) == 0) return std::nullopt;
  auto& t = table();
  std::lock_guard lock(t.mutex);
  auto it = t.group_of_task.find(task);
  if (it == t.group_of_task.end()) return std::nullopt;
  return it->second;
}

}  // namespace

void note_graph_task_started(int64_t graph_task_id) {
  int64_t group = open_group;
  if (group == 0) {
    // A backward started from inside a grouped backward (a device thread, a reentrant call).
    auto parent = group_of_task(current_graph_task_id());
    if (!parent) return;
    group = *parent;
  }
  auto& t = table();
  std::lock_guard lock(t.mutex);
  t.group_of_task[graph_task_id] = group;
  t.tasks_of_group[group].push_back(graph_task_id);
}

int64_t current_recompute_key() {
  const int64_t task = current_graph_task_id();
  if (task == -1) return fresh_key();
  return group_of_task(task).value_or(task);
}

bool in_graph_exec_group() { return group_of_task(current_graph_task_id()).has_value(); }

}  // namespace detail

GraphExecGroup::GraphExecGroup() {
  if (detail::open_group != 0) {
    throw CheckpointError("recompose: GraphExecGroup: groups cannot be nested; group " +
                          std::to_string(detail::open_group) +
                          " is already open on this thread. Close it before opening another.");
  }
  key_ = detail::fresh_key();
  detail::open_group = key_;
  detail::groups_alive.fetch_add(1, std::memory_order_release);
}

GraphExecGroup::~GraphExecGroup() {
  if (detail::open_group == key_) detail::open_group = 0;
  {
    auto& t = detail::table();
    std::lock_guard lock(t.mutex);
    auto it = t.tasks_of_group.find(key_);
    if (it != t.tasks_of_group.end()) {
      for (int64_t task : it->second) t.group_of_task.erase(task);
      t.tasks_of_group.erase(it);
    }
  }
  detail::groups_alive.fetch_sub(1, std::memory_order_release);
}

}  // namespace recompose
