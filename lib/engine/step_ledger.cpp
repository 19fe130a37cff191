// StepLedger's recording: rows made by the region protocol, bytes charged by storage, rebuilds
// reported by the frame and the selective replay. See include/recompose/step_ledger.h.
#include "engine/step_ledger.h"

#include "engine/checkpoint_depth.h"
#include "engine/meter_charge.h"
#include "engine/region_forward_policy.h"
#include "engine/saved_tensor_policy.h"
#include "engine/step_ledger_state.h"
#include "engine/tensor_accounting.h"

#include <recompose/checkpoint_error.h>
#include <recompose/checkpoint_options.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/step_ledger.h>

#include <torch/nn/module.h>

#include <algorithm>
#include <utility>

namespace recompose {
namespace detail {

std::atomic<int> g_ledgers_alive{0};

namespace {

// The ledger alive on this thread (consulted only when g_ledgers_alive is non-zero), the row whose
// forward runs here, the row being rebuilt here.
thread_local std::shared_ptr<LedgerState> t_ledger;
thread_local LedgerRow* t_forward_row = nullptr;
thread_local LedgerRow* t_rebuild_row = nullptr;

LedgerState* open_ledger() {
  if (!t_ledger) return nullptr;
  if (!t_ledger->open.load(std::memory_order_acquire)) {
    t_ledger.reset();  // destroyed on another thread: stop recording here
    return nullptr;
  }
  return t_ledger.get();
}

std::string module_label(const LedgerState& ledger, const torch::nn::Module& module) {
  auto it = ledger.names.find(&module);
  if (it == ledger.names.end() || it->second.empty()) return module.name();
  return it->second + " (" + module.name() + ")";
}

std::string region_name(LedgerState& ledger, const CheckpointOptions& options,
                        const torch::nn::Module* owner) {
  if (owner != nullptr) return module_label(ledger, *owner);
  if (options.state_modules().empty()) return "checkpoint #" + std::to_string(++ledger.unnamed);
  std::string name = "checkpoint(";
  for (std::size_t i = 0; i < options.state_modules().size(); ++i) {
    if (i != 0) name += ", ";
    const auto& m = options.state_modules()[i];
    auto it = ledger.names.find(m.get());
    name += it != ledger.names.end() && !it->second.empty() ? it->second : m->name();
  }
  return name + ")";
}

// What an applied plan chose for `module`, on its row (nothing without a plan).
void note_plan(LedgerRow& row, const torch::nn::Module& module) {
  static const hooks::ComposableApi<PlanEntryState> plan_api(kPlanApi, "recompose::apply_plan");
  if (auto plan = plan_api.state(module)) {
    row.region.plan_entry = plan->entry;
    row.region.plan_bytes = plan->estimate_bytes;
  }
}

std::string region_mode(const CheckpointOptions& options) {
  std::string mode = options.context_fn() ? "custom contexts"
                     : options.policy()   ? "selective"
                                          : "full";
  if (options.swap_inputs()) mode += " + swap inputs";
  return mode;
}

// Charges `bytes` of `storage` (null: bytes of no storage) to `row`, each storage once in the
// ledger. The entry holds the storage weakly: its memory is freed as usual, its address not reused
// while the ledger lives. Under ledger.mutex.
void add_use(LedgerState& ledger, LedgerRow& row, c10::StorageImpl* storage, int64_t bytes) {
  if (storage == nullptr) {
    row.live += bytes;
    return;
  }
  auto it = ledger.storages.find(storage);
  if (it == ledger.storages.end()) {
    it = ledger.storages
             .emplace(
                 storage,
                 LedgerState::Use{c10::weak_intrusive_ptr<c10::StorageImpl>(
                                      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)),
                                  0, bytes, &row})
             .first;
    row.live += bytes;
  }
  ++it->second.refs;
}

// A charge of the meters taken by a row: refunded when the charge goes.
struct LedgerCharge {
  LedgerCharge(std::shared_ptr<LedgerRow> r, c10::StorageImpl* s, int64_t b)
      : row(std::move(r)), storage(s), bytes(b) {}
  LedgerCharge(const LedgerCharge&) = delete;  // one refund per charge
  LedgerCharge& operator=(const LedgerCharge&) = delete;
  std::shared_ptr<LedgerRow> row;
  c10::StorageImpl* storage;
  int64_t bytes;
  ~LedgerCharge() {
    LedgerState& ledger = *row->ledger;
    std::lock_guard lock(ledger.mutex);
    if (storage == nullptr) {
      row->live -= bytes;
      return;
    }
    auto it = ledger.storages.find(storage);
    if (it == ledger.storages.end() || --it->second.refs > 0) return;
    it->second.row->live -= it->second.bytes;
    ledger.storages.erase(it);
  }
};

}  // namespace

std::shared_ptr<LedgerRow> ledger_begin_region(const CheckpointOptions& options,
                                               const torch::nn::Module* owner) {
  LedgerState* ledger = open_ledger();
  if (ledger == nullptr || CheckpointDepth::recompute() != 0) return nullptr;
  if (owner != nullptr && t_forward_row != nullptr && t_forward_row->offload_module == owner &&
      t_forward_row->ledger.get() == ledger) {
    // The region of a module whose offloaded call began just now: one row for both.
    std::lock_guard lock(ledger->mutex);
    t_forward_row->offload_module = nullptr;
    t_forward_row->region.checkpointed = true;
    t_forward_row->region.mode = region_mode(options) + " + offload";
    return t_forward_row->shared_from_this();
  }
  auto row = std::make_shared<LedgerRow>();
  row->ledger = t_ledger;
  row->region.depth = t_forward_row != nullptr ? t_forward_row->region.depth + 1 : 0;
  row->region.mode = region_mode(options);
  if (owner != nullptr) note_plan(*row, *owner);
  std::lock_guard lock(ledger->mutex);
  row->region.name = region_name(*ledger, options, owner);
  row->index = static_cast<int>(ledger->rows.size());
  ledger->rows.push_back(row);
  ledger_sample(*ledger, "forward begin", row.get());
  return row;
}

LedgerForwardScope::LedgerForwardScope(std::shared_ptr<LedgerRow> row)
    : outer_(t_forward_row), row_(std::move(row)) {
  t_forward_row = row_.get();
}

LedgerForwardScope::~LedgerForwardScope() { t_forward_row = outer_; }

void ledger_inputs_saved(LedgerRow& row, LedgerInputs how, const std::vector<at::Tensor>& inputs) {
  LedgerState& ledger = *row.ledger;
  std::lock_guard lock(ledger.mutex);
  row.region.inputs = how == LedgerInputs::Held        ? "held"
                      : how == LedgerInputs::Enclosing ? "enclosing region"
                                                       : "outer policy";
  if (how != LedgerInputs::Held) return;
  // As the meter counts saved tensors: by storage, parameters not at all. Inputs are held until
  // backward; their entries are never refunded (an entry whose storage died is reused).
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || !t.has_storage() || is_parameter_like(t)) continue;
    add_use(ledger, row, t.storage().unsafeGetStorageImpl(),
            static_cast<int64_t>(t.storage().nbytes()));
  }
  row.input_bytes = row.live;  // nothing else is charged to the row before its inputs
}

LedgerInputs ledger_classify_inputs() {
  // The innermost policy saves the inputs (See Note [ Nestable Checkpoint ], rule 2).
  const SavedTensorPolicy* innermost = nullptr;
  for_each_policy([&](SavedTensorPolicy& policy) {
    if (innermost == nullptr) innermost = &policy;
  });
  if (innermost == nullptr || is_meter_policy(*innermost)) return LedgerInputs::Held;
  if (dynamic_cast<const RegionForwardPolicy*>(innermost) != nullptr)
    return LedgerInputs::Enclosing;
  return LedgerInputs::Outer;
}

LedgerRow* ledger_row_running_here(bool& in_backward) {
  in_backward = t_rebuild_row != nullptr;
  return in_backward ? t_rebuild_row : t_forward_row;
}

void ledger_forward_ended(LedgerRow& row) {
  std::lock_guard lock(row.ledger->mutex);
  row.region.bytes_held = row.live;
  ledger_sample(*row.ledger, "forward end", &row);
}

std::shared_ptr<void> ledger_charge(const at::Tensor& tensor, int64_t bytes) {
  LedgerRow* row = t_forward_row;
  if (row == nullptr || !row->ledger->open.load(std::memory_order_acquire)) return nullptr;
  c10::StorageImpl* storage = nullptr;
  if (tensor.defined()) {
    storage = tensor.storage().unsafeGetStorageImpl();
    bytes = static_cast<int64_t>(tensor.storage().nbytes());
  }
  {
    std::lock_guard lock(row->ledger->mutex);
    add_use(*row->ledger, *row, storage, bytes);
  }
  return std::make_shared<LedgerCharge>(row->shared_from_this(), storage, bytes);
}

LedgerRebuildScope::LedgerRebuildScope(LedgerRow* row)
    : row_(row), outer_(t_rebuild_row), start_(std::chrono::steady_clock::now()) {
  t_rebuild_row = row_;
  std::lock_guard lock(row_->ledger->mutex);
  ledger_sample(*row_->ledger, "rebuild begin", row_);
}

LedgerRebuildScope::~LedgerRebuildScope() {
  t_rebuild_row = outer_;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  std::lock_guard lock(row_->ledger->mutex);
  LedgerRegion& r = row_->region;
  ++r.rebuilds;
  if (reran_) ++r.reruns;
  r.host_ns += ns;
  ledger_sample(*row_->ledger, "rebuild end", row_);
}

bool ledger_rebuilding() { return t_rebuild_row != nullptr; }

std::shared_ptr<LedgerRow> ledger_begin_offload(const torch::nn::Module& module) {
  LedgerState* ledger = open_ledger();
  if (ledger == nullptr || CheckpointDepth::recompute() != 0) return nullptr;
  auto row = std::make_shared<LedgerRow>();
  row->ledger = t_ledger;
  row->offload_module = &module;
  row->region.depth = t_forward_row != nullptr ? t_forward_row->region.depth + 1 : 0;
  row->region.mode = "offload";
  row->region.inputs = "-";
  row->region.checkpointed = false;
  note_plan(*row, module);
  std::lock_guard lock(ledger->mutex);
  row->region.name = module_label(*ledger, module);
  row->index = static_cast<int>(ledger->rows.size());
  ledger->rows.push_back(row);
  ledger_sample(*ledger, "forward begin", row.get());
  return row;
}

void ledger_offload_ended(LedgerRow& row) {
  if (row.region.checkpointed) {
    // A region took it over: its end was sampled before the offload's post-hook launched any
    // copies (keep_last_on_device(false)); what it holds is counted again, with no new sample.
    std::lock_guard lock(row.ledger->mutex);
    row.region.bytes_held = row.live;
    return;
  }
  row.offload_module = nullptr;
  ledger_forward_ended(row);
}

std::shared_ptr<LedgerRow> ledger_swap_row() {
  LedgerRow* row = t_forward_row;
  if (row == nullptr || !row->ledger->open.load(std::memory_order_acquire)) return nullptr;
  return row->shared_from_this();
}

void ledger_swapped(LedgerRow& row, const LedgerSwap& swap) {
  if (!row.ledger->open.load(std::memory_order_acquire)) return;
  std::lock_guard lock(row.ledger->mutex);
  row.region.swap += swap;
}

void ledger_kept(LedgerRow& row, const char* reason, int64_t bytes) {
  if (!row.ledger->open.load(std::memory_order_acquire) || reason == nullptr) return;
  std::lock_guard lock(row.ledger->mutex);
  auto& kept = row.region.kept;
  auto it = std::find_if(kept.begin(), kept.end(),
                         [&](const LedgerKept& k) { return k.reason == reason; });
  if (it == kept.end()) it = kept.insert(kept.end(), LedgerKept{reason, 0, 0});
  it->tensors += 1;
  it->bytes += bytes;
}

void ledger_policy_unmatched(std::vector<std::string> names) {
  LedgerRow* row = t_forward_row;
  if (row == nullptr) return;
  std::lock_guard lock(row->ledger->mutex);
  row->region.unmatched_policy_names = std::move(names);
}

void ledger_replayed(const ReplayOutcome& replay) {
  LedgerRow* row = t_rebuild_row;
  if (row == nullptr) return;
  std::lock_guard lock(row->ledger->mutex);
  LedgerRegion& r = row->region;
  if (!replay.replayed) {
    r.fallback_reason = replay.fallback_reason;
    return;
  }
  ++r.replays;
  r.ops_run += replay.ops_run;
  r.ops_skipped += replay.ops_skipped;
  r.ops_substituted += replay.ops_substituted;
  r.draws_written += replay.draws_written;
  r.writes_carried += replay.writes_carried;
}

}  // namespace detail

StepLedger::StepLedger() {
  if (detail::open_ledger() != nullptr) {
    throw CheckpointError(
        "recompose: StepLedger: a ledger is alive on this thread already; one ledger per thread "
        "at a time (destroy the first before making another)");
  }
  state_ = std::make_shared<State>();
  detail::t_ledger = state_;
  detail::g_ledgers_alive.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(state_->mutex);
  detail::ledger_sample(*state_, "start", nullptr, "start");
}

StepLedger::StepLedger(const torch::nn::Module& root) : StepLedger() {
  for (const auto& item : root.named_modules("", /*include_self=*/true))
    state_->names.emplace(item.value().get(), item.key());
  // The timeline samples the root's device (its first parameter's or buffer's): the start again.
  for (const auto& p : root.parameters()) {
    state_->device = p.device();
    break;
  }
  if (state_->device.is_cpu()) {
    for (const auto& b : root.buffers()) {
      state_->device = b.device();
      break;
    }
  }
  std::lock_guard lock(state_->mutex);
  state_->samples.clear();
  detail::ledger_sample(*state_, "start", nullptr, "start");
}

StepLedger::~StepLedger() {
  state_->open.store(false, std::memory_order_release);
  if (detail::t_ledger == state_) detail::t_ledger.reset();  // elsewhere: reset there on next use
  {
    // Rows and storage entries point at each other and at the state: break the cycles. Rows kept
    // by frames live on, unread.
    std::lock_guard lock(state_->mutex);
    state_->rows.clear();
    state_->storages.clear();
    state_->samples.clear();
  }
  detail::g_ledgers_alive.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<LedgerRegion> StepLedger::regions() const {
  std::lock_guard lock(state_->mutex);
  std::vector<LedgerRegion> out;
  out.reserve(state_->rows.size());
  for (const auto& row : state_->rows) out.push_back(row->region);
  return out;
}

int64_t StepLedger::bytes_held() const {
  int64_t total = 0;
  for (const auto& r : regions()) total += r.bytes_held;
  return total;
}

void ledger_mark(const std::string& label) {
  if (!detail::any_ledger_alive()) return;
  detail::LedgerState* ledger = detail::open_ledger();
  if (ledger == nullptr) return;
  std::lock_guard lock(ledger->mutex);
  detail::ledger_sample(*ledger, "mark", nullptr, label);
}

}  // namespace recompose
