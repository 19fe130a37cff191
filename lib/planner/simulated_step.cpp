// CopyWindowModel::simulate(): the whole step as SwapManager runs it (copy_window_model.h): the
// forward with its copies out and the throttle, then the backward with reloads on demand or
// prefetched, noting the most held at each moment.
#include "copy_window_model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>

namespace recompose::detail {
namespace {

class StepSimulation {
 public:
  StepSimulation(const CopyWindowModel& model, const std::vector<ModuleLoad>& loads)
      : model_(model), ms_(model.compute().modules), loads_(loads), n_(ms_.size()) {
    s_.forward_wait_seconds.assign(n_, 0.0);
    s_.backward_wait_seconds.assign(n_, 0.0);
  }

  SimulatedStep run(int64_t base_bytes) {
    forward(base_bytes);
    backward();
    s_.seconds = t_;
    s_.compute_seconds =
        model_.compute().forward_tail_seconds + model_.compute().backward_head_seconds;
    for (size_t i = 0; i < n_; ++i) {
      s_.compute_seconds +=
          ms_[i].forward_seconds + ms_[i].backward_seconds + loads_[i].recompute_seconds;
    }
    return s_;
  }

 private:
  // Copies on the copy stream, oldest first; they land in order.
  struct Flight {
    int64_t bytes;
    double lands;
    size_t module;
  };

  void note(int64_t bytes, bool backward, int module) {
    if (bytes > s_.peak_bytes)
      s_.peak_bytes = bytes, s_.peak_in_backward = backward, s_.peak_module = module;
  }
  void land() {
    flying_bytes_ -= flying_.front().bytes;
    flying_.pop_front();
  }
  void land_until(double t) {
    while (!flying_.empty() && flying_.front().lands <= t) land();
  }

  // Forward. `held_`: base and what earlier modules keep.
  void forward(int64_t base_bytes) {
    held_ = base_bytes;
    note(held_, false, -1);
    for (size_t i = 0; i < n_; ++i) forward_module(i);
    t_ += model_.compute().forward_tail_seconds;
  }

  void forward_module(size_t i) {
    const ModuleLoad& l = loads_[i];
    land_until(t_);
    // The throttle: an offloading module first waits (host and compute) until at most G - 1
    // earlier modules' copies are in flight.
    const int64_t groups = model_.max_groups_in_flight();
    if (l.offload_bytes > 0 && groups > 0) {
      while (static_cast<int64_t>(flying_.size()) >= groups) {
        s_.forward_wait_seconds[flying_.front().module] += flying_.front().lands - t_;
        t_ = flying_.front().lands;
        land();
      }
    }
    const double start = t_, end = t_ + ms_[i].forward_seconds;
    const int64_t mine = l.held_bytes + l.offload_bytes;
    // Just before each copy lands: the module has allocated its share of the time so far.
    while (!flying_.empty() && flying_.front().lands <= end) {
      const double share =
          ms_[i].forward_seconds > 0
              ? std::clamp((flying_.front().lands - start) / ms_[i].forward_seconds, 0.0, 1.0)
              : 0.0;
      note(held_ + flying_bytes_ +
               static_cast<int64_t>(std::floor(share * static_cast<double>(mine))),
           false, static_cast<int>(i));
      land();
    }
    note(held_ + flying_bytes_ + mine, false, static_cast<int>(i));
    t_ = end;
    held_ += l.held_bytes;
    if (l.offload_bytes > 0) {
      link_free_ =
          std::max(t_, link_free_) + model_.link().d2h_seconds(l.offload_bytes, l.offload_copies);
      flying_.push_back({l.offload_bytes, link_free_, i});
      flying_bytes_ += l.offload_bytes;
    }
  }

  // Backward. A module's reload starts when the nearest later offloading module is first used
  // (prefetch), else when its own backward needs it; it queues behind what the stream has.
  void backward() {
    reloaded_.assign(n_, -1.0);
    land_until(t_);
    note(held_ + flying_bytes_, true, -1);
    t_ += model_.compute().backward_head_seconds;
    for (size_t i = n_; i-- > 0;) backward_module(i);
  }

  void backward_module(size_t i) {
    const ModuleLoad& l = loads_[i];
    land_until(t_);
    if (l.offload_bytes > 0) {
      reload(i);  // on demand, unless prefetched
      if (reloaded_[i] > t_) {
        s_.backward_wait_seconds[i] = reloaded_[i] - t_;
        t_ = reloaded_[i];
      }
      if (auto p = previous_offloading(i)) reload(*p);
    }
    note(held_ + flying_bytes_ + l.backward_bytes, true, static_cast<int>(i));
    t_ += ms_[i].backward_seconds + l.recompute_seconds;
    held_ -= l.held_bytes + l.offload_bytes;
  }

  void reload(size_t i) {
    if (reloaded_[i] >= 0) return;
    const ModuleLoad& l = loads_[i];
    held_ += l.offload_bytes;
    link_free_ =
        std::max(t_, link_free_) + model_.link().h2d_seconds(l.offload_bytes, l.offload_copies);
    reloaded_[i] = link_free_;
  }

  std::optional<size_t> previous_offloading(size_t i) const {
    for (size_t j = i; j-- > 0;) {
      if (loads_[j].offload_bytes > 0) return j;
    }
    return std::nullopt;
  }

  const CopyWindowModel& model_;
  const std::vector<StepCompute::Module>& ms_;
  const std::vector<ModuleLoad>& loads_;
  size_t n_ = 0;
  SimulatedStep s_;
  std::deque<Flight> flying_;
  int64_t flying_bytes_ = 0;
  double link_free_ = 0;  // when the copy stream has run what is queued on it
  double t_ = 0;
  int64_t held_ = 0;
  std::vector<double> reloaded_;  // per module, when its reload lands; < 0: not launched
};

}  // namespace

SimulatedStep CopyWindowModel::simulate(const std::vector<ModuleLoad>& loads,
                                        int64_t base_bytes) const {
  if (loads.size() != compute_.modules.size()) {
    throw std::invalid_argument(
        "recompose: CopyWindowModel::simulate: " + std::to_string(loads.size()) + " loads for " +
        std::to_string(compute_.modules.size()) + " modules");
  }
  return StepSimulation(*this, loads).run(base_bytes);
}

}  // namespace recompose::detail
