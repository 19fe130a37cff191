#include "swap/swap_groups.h"

#include <recompose/checkpoint_error.h>

#include <algorithm>
#include <string>
#include <utility>

namespace recompose::detail {

int64_t SwapGroups::create() {
  const int64_t id = next_++;
  groups_[id];
  counters_.update([](SwapStats& s) { ++s.groups; });
  return id;
}

void SwapGroups::erase_if_done(int64_t id) {
  auto it = groups_.find(id);
  if (it == groups_.end() || !it->second.tensors.empty() || open_somewhere(id)) return;
  // An emptied implicit group is forgotten too: the next offload starts a new one.
  if (implicit_ == id) implicit_.reset();
  groups_.erase(it);
}

bool SwapGroups::open_somewhere(int64_t id) const {
  return std::ranges::any_of(open_, [&](const auto& thread_open) {
    return std::ranges::find(thread_open.second, id) != thread_open.second.end();
  });
}

void SwapGroups::set_implicit(std::optional<int64_t> id) {
  const auto previous = std::exchange(implicit_, id);
  if (previous) erase_if_done(*previous);
}

int64_t SwapGroups::open() {
  set_implicit(std::nullopt);
  const int64_t id = create();
  open_[std::this_thread::get_id()].push_back(id);
  return id;
}

void SwapGroups::close(int64_t id) {
  auto mine = open_.find(std::this_thread::get_id());
  if (mine == open_.end() || mine->second.back() != id) {
    std::string why;
    if (mine != open_.end() && std::ranges::find(mine->second, id) != mine->second.end()) {
      why = "group " + std::to_string(mine->second.back()) +
            ", opened after it on this thread, is still open; groups must close in LIFO order";
    } else if (open_somewhere(id)) {
      why = "it was opened on another thread; close a group on the thread that opened it";
    } else {
      why = "it is not open";
    }
    throw CheckpointError("recompose: SwapManager::end_group(" + std::to_string(id) +
                          "): not the innermost open group of this thread: " + why);
  }
  mine->second.pop_back();
  if (mine->second.empty()) open_.erase(mine);
  erase_if_done(id);
  set_implicit(std::nullopt);
}

void SwapGroups::force_close(int64_t id) {
  for (auto it = open_.begin(); it != open_.end();) {
    std::erase(it->second, id);
    it = it->second.empty() ? open_.erase(it) : std::next(it);
  }
  erase_if_done(id);
  set_implicit(std::nullopt);
}

void SwapGroups::close_implicit() { set_implicit(std::nullopt); }

int64_t SwapGroups::group_for(int64_t bytes) {
  if (auto mine = open_.find(std::this_thread::get_id()); mine != open_.end())
    return mine->second.back();
  if (implicit_) {
    auto it = groups_.find(*implicit_);
    if (it != groups_.end() &&
        (it->second.bytes == 0 || it->second.bytes + bytes <= implicit_group_bytes_)) {
      return *implicit_;
    }
  }
  set_implicit(create());
  return *implicit_;
}

void SwapGroups::add(SwapEntry& entry) {
  auto& group = groups_[entry.group];
  group.tensors.push_back(&entry);
  group.bytes += entry.nbytes;
}

void SwapGroups::remove(const SwapEntry& entry) {
  auto it = groups_.find(entry.group);
  if (it == groups_.end()) return;
  auto& tensors = it->second.tensors;
  // Backward frees tensors about in reverse order of offload: search from the back.
  auto member = std::find(tensors.rbegin(), tensors.rend(), &entry);
  if (member != tensors.rend()) tensors.erase(std::next(member).base());
  erase_if_done(entry.group);
}

SwapGroups::Group* SwapGroups::find(int64_t id) {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : &it->second;
}

int64_t SwapGroups::entries() const {
  auto n = static_cast<int64_t>(groups_.size() + open_.size());
  for (const auto& [thread, open] : open_) n += static_cast<int64_t>(open.size());
  for (const auto& [id, group] : groups_) n += static_cast<int64_t>(group.tensors.size());
  return n;
}

}  // namespace recompose::detail
