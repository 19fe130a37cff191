#include "engine/frame.h"

#include "engine/autograd_sequence_adapter.h"
#include "engine/checkpoint_depth.h"
#include "engine/current_graph_task.h"
#include "engine/op_trace.h"
#include "engine/saved_tensor_policy.h"

#include <recompose/checkpoint_error.h>

#include <ATen/core/grad_mode.h>

#include <atomic>
#include <optional>
#include <sstream>
#include <string>

namespace recompose::detail {
namespace {

// Thrown by the recomputation's pack hook once every needed tensor is back. Not a
// std::exception, so that user code catching std::exception inside the body cannot swallow it.
// See Note [ Nestable Checkpoint ], rule 5.
struct StopRecomputation {};

// Hooks of one tensor saved during a recomputation: hands the recomputed tensor to the frame
// and keeps it, so that a backward over the recomputed graph also works.
// See Note [ Nestable Checkpoint ], rule 6.
class RecomputationHooks final : public torch::autograd::SavedVariableHooks {
 public:
  RecomputationHooks(std::shared_ptr<Frame> frame, int64_t graph_task)
      : frame_(std::move(frame)), graph_task_(graph_task) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    // Without its graph: the recomputed graph's nodes save this tensor through these hooks, a
    // cycle otherwise. tensor_data() shares storage and version counter as detach() does, without
    // a trip through the dispatcher (0.4 against 1.1 us per tensor here); the backward formulas
    // that unpack it read values, never view relations.
    saved_ = tensor.requires_grad() ? tensor.tensor_data() : tensor;
    frame_->record_recomputed(graph_task_, saved_);
  }
  at::Tensor call_unpack_hook() override { return saved_; }

 private:
  std::shared_ptr<Frame> frame_;
  int64_t graph_task_;
  at::Tensor saved_;
};

class RecomputationPolicy final : public SavedTensorPolicy {
 public:
  RecomputationPolicy(std::shared_ptr<Frame> frame, int64_t graph_task)
      : frame_(std::move(frame)), graph_task_(graph_task) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<RecomputationHooks>(frame_, graph_task_);
  }

 private:
  std::shared_ptr<Frame> frame_;
  int64_t graph_task_;
};

constexpr const char* kDebugTip =
    "\nTip: to see the ops of the original forward and of the recomputation, pass "
    "CheckpointOptions().debug(true) or keep a recompose::set_checkpoint_debug_enabled(true) guard "
    "alive while the forward runs.";

}  // namespace

Frame::Frame(RecomputeFn recompute, bool early_stop, DeterminismCheck check, bool debug)
    : recompute_fn_(std::move(recompute)),
      early_stop_(early_stop),
      early_stop_asked_(early_stop),
      check_(check),
      debug_(debug) {
  if (debug_) {
    forward_ops_ = std::make_shared<std::vector<std::string>>();
    recompute_ops_ = std::make_shared<std::vector<std::string>>();
  }
}

Frame::Recomputation& Frame::recomputation(int64_t graph_task) {
  for (auto& r : recomputations_) {
    if (r.graph_task == graph_task) return r;
  }
  recomputations_.push_back(Recomputation{graph_task});
  return recomputations_.back();
}

std::size_t Frame::record_saved(const at::Tensor& tensor) {
  std::lock_guard lock(mutex_);
  holders_.emplace_back();
  if (check_ != DeterminismCheck::None) metadata_.push_back(TensorMeta::of(tensor));
  const bool output = is_output_of_newest_node(tensor);
  const uint64_t next_node = next_autograd_sequence_nr();
  sequence_after_last_output_ = output ? next_node : 0;
  // An input without gradient saved by the op that saves last: its kernel, still to run, may
  // write into it. See Note [ Early stop after the op's own writes ].
  if (output || next_node != next_node_at_last_save_) last_saved_may_be_written_ = false;
  if (may_be_written_by_saving_op(tensor, output)) last_saved_may_be_written_ = true;
  next_node_at_last_save_ = next_node;
  if (replay_ != nullptr) replay_->saved(holders_.size() - 1, tensor);
  return holders_.size() - 1;
}

void Frame::release_saved(std::size_t index) {
  std::lock_guard lock(mutex_);
  Holder& holder = holders_[index];
  holder.alive = false;
  holder.slots.clear();  // recomputed values no graph will unpack
}

void Frame::mark_forward_completed() {
  forward_completed_ = true;
  // No autograd node was made after the last saved output: what follows it in the body creates
  // no graph (returning, views of nothing new, no-grad work), so stopping there saves nothing
  // while the exception costs more than a small op. The decision depends only on the program's
  // structure, never on timing, so every rank of a distributed job takes the same one.
  // See Note [ Early stop only where it skips something ].
  if (early_stop_ && sequence_after_last_output_ != 0 &&
      next_autograd_sequence_nr() == sequence_after_last_output_) {
    early_stop_ = false;
  }
  // Stopping at the last save would stop before its op's kernel, which may still write into it.
  // See Note [ Early stop after the op's own writes ].
  if (last_saved_may_be_written_) early_stop_ = false;
}

at::Tensor Frame::unpack(std::size_t index) {
  const int64_t graph_task = current_recompute_key();
  std::lock_guard lock(mutex_);
  if (!recomputation(graph_task).done) {
    recompute(graph_task);
    recomputation(graph_task).done =
        true;  // a reference could dangle: nested unpacks may add entries
    check_recomputed_tensors_match(graph_task);
  }
  Holder::Slot* slot = holders_[index].find(graph_task);
  if (slot == nullptr) {
    fail(
        "internal error: a saved tensor was not recomputed. Please report this with the model that "
        "triggers it.");
  }
  if (slot->consumed) {
    fail(std::string("Unpack is being triggered for a tensor that was already unpacked once. ") +
         (in_graph_exec_group() ? "Two backward calls under one recompose::GraphExecGroup used the "
                                  "same saved tensor of a region; "
                                  "the backward calls of a group must use disjoint parts of the "
                                  "graph (or run them outside the group). "
                                : "") +
         "If you read ctx->get_saved_variables() in a custom backward, do so only once.");
  }
  at::Tensor out = std::move(slot->value);
  slot->value = at::Tensor();
  slot->consumed =
      true;  // cleared, even with retain_graph: See Note [ Nestable Checkpoint ], rule 4
  return out;
}

void Frame::recompute(int64_t graph_task) {
  if (!rng_problem_.empty()) {
    fail("the device state of " + rng_problem_ +
         " was initialised in the forward of a checkpointed region, "
         "so its RNG state could not be stashed and the recomputation would draw other random "
         "numbers. "
         "Initialise the device before the region (e.g. create a tensor on it), or pass "
         "CheckpointOptions().preserve_rng_state(false) if the region draws no random numbers "
         "there.");
  }
  // Unpacking the inputs may recompute the enclosing regions first.
  // See Note [ Nestable Checkpoint ], rules 1 and 2.
  std::vector<at::Tensor> inputs = unpack_region_inputs(*inputs_);
  // After the inputs: the enclosing regions' rebuilds are theirs.
  events::RebuildScope rebuild_events(events_tag_);
  try {
    rebuild(graph_task, inputs, rebuild_events);
  } catch (...) {
    rebuild_events.end(std::current_exception());
    throw;
  }
}

void Frame::rebuild(int64_t graph_task, const std::vector<at::Tensor>& inputs,
                    events::RebuildScope& rebuild_events) {
  if (replay_saved(graph_task, inputs)) return;
  rebuild_events.reran();
  if (recompute_ops_) recompute_ops_->clear();
  SavedTensorPolicyBarrier
      barrier;  // as if no region were active: See Note [ Nestable Checkpoint ], rule 3
  RecomputationPolicy policy(shared_from_this(), graph_task);
  SavedTensorPolicyScope scope(policy);
  at::AutoGradMode grad_on(true);
  ForwardStateRestorer restore(forward_state_);
  ModuleStateSnapshot::RecomputeScope module_modes_and_buffers(module_state());
  DepthGuard depth(CheckpointDepth::recompute());
  std::shared_ptr<void> context = contexts_ ? contexts_->enter_recompute() : nullptr;
  std::optional<OpTrace> trace;
  if (debug_) trace.emplace(recompute_ops_);
  try {
    recompute_fn_(inputs);
  } catch (const StopRecomputation&) {
  }
}

bool Frame::replay_saved(int64_t graph_task, const std::vector<at::Tensor>& inputs) {
  // Debug mode lists the recomputation's ops in its errors: it runs the forward. A backward
  // inside the forward (not completed) sees only part of the saved tensors.
  if (replay_ == nullptr) return false;
  if (debug_ || contains_region_ || !forward_completed_) {
    replay_->not_replayed(
        debug_             ? "debug mode lists the ops of a recomputation: the forward runs again"
        : contains_region_ ? "another checkpointed region ran inside its forward"
                           : "a backward ran inside its forward");
    return false;
  }
  std::vector<bool> needed(holders_.size());
  for (std::size_t i = 0; i < holders_.size(); ++i) needed[i] = holders_[i].alive;
  std::vector<at::Tensor> values;
  if (!replay_->replay(inputs, forward_state_.cpu_rng != nullptr, needed, values)) return false;
  Recomputation& r = recomputation(graph_task);
  for (std::size_t i = 0; i < holders_.size(); ++i) {
    if (needed[i]) holders_[i].put(graph_task, std::move(values[i]));
  }
  r.count = holders_.size();
  return true;
}

void Frame::record_recomputed(int64_t graph_task, const at::Tensor& detached) {
  std::lock_guard lock(mutex_);
  Recomputation& r = recomputation(graph_task);
  const std::size_t index = r.count++;
  if (index >= holders_.size()) {
    if (!forward_completed_) {
      // A backward inside the region's forward with early stop off: the forward has not saved
      // everything yet, so counts cannot be compared.
      ignore_saved_mismatch_ = true;
      return;
    }
    if (early_stop_asked_) {
      r.count = holders_.size();  // early stop would have ended the recomputation before this save
      return;
    }
    fail("trying to save more tensors during recomputation than during the original forward pass.");
  }
  if (holders_[index].alive) holders_[index].put(graph_task, detached);
  if (early_stop_ && r.count == holders_.size()) throw StopRecomputation{};
}

void Frame::check_recomputed_tensors_match(int64_t graph_task) {
  if (ignore_saved_mismatch_) return;
  const std::size_t recomputed = recomputation(graph_task).count;
  if (recomputed != holders_.size()) {
    fail(
        "A different number of tensors was saved during the original forward and recomputation.\n"
        "Number of tensors saved during forward: " +
        std::to_string(holders_.size()) +
        "\nNumber of tensors saved during recomputation: " + std::to_string(recomputed) + ".");
  }
  if (check_ == DeterminismCheck::None) return;
  // Compared first, described only on a mismatch: an ostringstream alone costs more than the check.
  auto mismatch_at = [&](std::size_t i) -> std::optional<TensorMeta> {
    if (!holders_[i].alive) return std::nullopt;
    const Holder::Slot* slot = holders_[i].find(graph_task);
    if (slot == nullptr || !slot->value.defined()) return std::nullopt;
    TensorMeta now = TensorMeta::of(slot->value);
    if (now == metadata_[i]) return std::nullopt;
    return now;
  };
  std::size_t first = 0;
  while (first < holders_.size() && !mismatch_at(first)) ++first;
  if (first == holders_.size()) return;
  std::ostringstream mismatches;
  for (std::size_t i = first; i < holders_.size(); ++i) {
    if (auto now = mismatch_at(i)) {
      mismatches << "tensor at position " << i << ":\nsaved metadata: " << metadata_[i].str()
                 << "\nrecomputed metadata: " << now->str() << "\n";
    }
  }
  fail(
      "Recomputed values for the following tensors have different metadata than during the forward "
      "pass.\n" +
      mismatches.str());
}

void Frame::fail(const std::string& message) {
  std::string text = "recompose: checkpoint: " + message;
  if (debug_) {
    text += "\n\nOperations executed during the original forward:\n" + format_ops(*forward_ops_) +
            "Operations executed during recomputation:\n" + format_ops(*recompute_ops_) +
            "Differences in detach calls between the two are expected and can be ignored.";
  } else {
    text += kDebugTip;
  }
  throw CheckpointError(text);
}

}  // namespace recompose::detail
