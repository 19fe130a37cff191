// The events' dispatch: the sinks listening on each thread, the regions running on it, and each
// event handed to the sinks of its region. See Note [ Events and sinks ] in events/events.h.
#include "events/events.h"

#include <algorithm>
#include <utility>

namespace recompose::events {

std::atomic<int> g_sinks_open{0};

namespace {

// Consulted only when g_sinks_open is non-zero: the sinks listening on this thread, the region
// whose forward runs here and the region being rebuilt here.
thread_local std::vector<std::shared_ptr<Sink>> t_sinks;
thread_local RegionTag* t_forward = nullptr;
thread_local RegionTag* t_rebuild = nullptr;

// Calls `f(sink, context)` for each open sink of `tag`.
template <typename F>
void each(const RegionTag& tag, F&& f) {
  for (const auto& entry : tag.entries()) {
    if (entry.sink->is_open()) f(*entry.sink, entry.context.get());
  }
}

void drop_closed_sinks() {
  std::erase_if(t_sinks, [](const std::shared_ptr<Sink>& s) { return !s->is_open(); });
}

// Calls `f(sink)` for each open sink listening on this thread. Over a copy: a sink may register
// or close another from its callback (one closed meanwhile is skipped).
template <typename F>
void each_listening(F&& f) {
  drop_closed_sinks();
  const auto sinks = t_sinks;
  for (const auto& sink : sinks) {
    if (sink->is_open()) f(sink);
  }
}

}  // namespace

Sink::~Sink() { close(); }

void Sink::listen() {
  if (!open_.exchange(true, std::memory_order_acq_rel))
    g_sinks_open.fetch_add(1, std::memory_order_relaxed);
  drop_closed_sinks();
  t_sinks.push_back(shared_from_this());
}

void Sink::close() {
  if (!open_.exchange(false, std::memory_order_acq_rel)) return;
  g_sinks_open.fetch_sub(1, std::memory_order_relaxed);
  // On another thread, that thread's list lets go of it at its next region.
  std::erase_if(t_sinks, [this](const std::shared_ptr<Sink>& s) { return s.get() == this; });
}

void* RegionTag::context_of(const Sink& sink) const {
  for (const auto& entry : entries_) {
    if (entry.sink.get() == &sink) return entry.context.get();
  }
  return nullptr;
}

Tag region_begun(const RegionBegun& event) {
  auto tag = std::make_shared<RegionTag>();
  each_listening([&](const std::shared_ptr<Sink>& sink) {
    void* enclosing = t_forward != nullptr ? t_forward->context_of(*sink) : nullptr;
    if (auto context = sink->region_begun(event, enclosing))
      tag->entries_.push_back({sink, std::move(context)});
  });
  if (tag->entries_.empty()) return nullptr;
  return tag;
}

ForwardScope::ForwardScope(Tag tag) : tag_(std::move(tag)), outer_(t_forward) {
  t_forward = tag_.get();
}

ForwardScope::~ForwardScope() { t_forward = outer_; }

RebuildScope::RebuildScope(Tag tag) : tag_(std::move(tag)), outer_(t_rebuild) {
  if (!tag_) {  // nobody records it: the outer rebuild, if any, stays the one running here
    ended_ = true;
    return;
  }
  start_ = std::chrono::steady_clock::now();
  t_rebuild = tag_.get();
  each(*tag_, [](Sink& s, void* region) { s.rebuild_begun(region); });
}

void RebuildScope::reran() {
  reran_ = true;
  if (!ended_) each(*tag_, [](Sink& s, void* region) { s.rebuild_reran(region); });
}

void RebuildScope::end(const std::exception_ptr& error) {
  if (ended_) return;
  ended_ = true;
  t_rebuild = outer_;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  each(*tag_, [&](Sink& s, void* region) { s.rebuild_ended(region, reran_, ns, error); });
}

RebuildScope::~RebuildScope() {
  // A destructor, possibly during unwinding: a sink that cannot record the end (out of memory)
  // leaves it unrecorded rather than end the program.
  try {
    end(nullptr);
  } catch (...) {  // NOLINT(bugprone-empty-catch)
  }
}

void inputs_saved(const RegionTag& tag, InputsSaved how, const std::vector<at::Tensor>& inputs) {
  each(tag, [&](Sink& s, void* region) { s.inputs_saved(region, how, inputs); });
}

void forward_ended(const RegionTag& tag, const std::exception_ptr& error) {
  each(tag, [&](Sink& s, void* region) { s.forward_ended(region, error); });
}

std::shared_ptr<void> bytes_charged(const at::Tensor& tensor, int64_t bytes) {
  if (t_forward == nullptr) return nullptr;
  std::shared_ptr<void> first;
  std::shared_ptr<std::vector<std::shared_ptr<void>>> several;
  each(*t_forward, [&](Sink& s, void* region) {
    auto token = s.bytes_charged(region, tensor, bytes);
    if (!token) return;
    if (!first) {
      first = std::move(token);
      return;
    }
    if (!several) several = std::make_shared<std::vector<std::shared_ptr<void>>>(1, first);
    several->push_back(std::move(token));
  });
  if (several) return several;
  return first;
}

void replayed(const ReplayOutcome& outcome) {
  if (t_rebuild == nullptr) return;
  each(*t_rebuild, [&](Sink& s, void* region) { s.replayed(region, outcome); });
}

void policy_unmatched(const std::vector<std::string>& names) {
  if (t_forward == nullptr) return;
  each(*t_forward, [&](Sink& s, void* region) { s.policy_unmatched(region, names); });
}

void copy_begun(const RegionTag& tag, CopyDirection direction) {
  each(tag, [&](Sink& s, void* region) { s.copy_begun(region, direction); });
}

void copy_launched(const RegionTag& tag, const CopyLaunched& copy) {
  each(tag, [&](Sink& s, void* region) { s.copy_launched(region, copy); });
}

void copy_landed(const RegionTag& tag, const CopyLanded& copy) {
  each(tag, [&](Sink& s, void* region) { s.copy_landed(region, copy); });
}

void reload_late(const RegionTag& tag, int64_t wait_ns) {
  each(tag, [&](Sink& s, void* region) { s.reload_late(region, wait_ns); });
}

void kept(const RegionTag& tag, KeptReason reason, int64_t bytes) {
  each(tag, [&](Sink& s, void* region) { s.kept(region, reason, bytes); });
}

void mark(const std::string& label) {
  each_listening([&](const std::shared_ptr<Sink>& sink) { sink->mark(label); });
}

Tag forward_tag() {
  if (!listening() || t_forward == nullptr) return nullptr;
  // The scope that set it holds a reference; the caller gets its own.
  for (const auto& entry : t_forward->entries()) {
    if (entry.sink->is_open()) return t_forward->shared_from_this();
  }
  return nullptr;
}

const RegionTag* running_here(bool& in_backward) {
  in_backward = t_rebuild != nullptr;
  return in_backward ? t_rebuild : t_forward;
}

bool rebuilding() { return t_rebuild != nullptr; }

}  // namespace recompose::events
