// StepLedger's recording: a sink of the events (events/events.h) that makes a row per region
// begun in a forward, charges bytes by storage and fills in the rebuilds, copies and kept tensors
// reported for each row. See include/recompose/step_ledger.h.
#include "ledger/ledger_state.h"
#include "ledger/plan_entry.h"

#include "engine/tensor_accounting.h"

#include <recompose/checkpoint_error.h>
#include <recompose/hooks/composable_api.h>
#include <recompose/step_ledger.h>

#include <torch/nn/module.h>

#include <algorithm>
#include <utility>

namespace recompose {
namespace detail {

namespace {

// The ledger listening on this thread (one at a time), until it is closed.
thread_local std::shared_ptr<LedgerState> t_ledger;

LedgerState* open_ledger() {
  if (!t_ledger) return nullptr;
  if (!t_ledger->is_open()) {
    t_ledger.reset();  // destroyed on another thread: forget it here
    return nullptr;
  }
  return t_ledger.get();
}

LedgerRow& row_of(void* region) { return *static_cast<LedgerRow*>(region); }

std::string module_label(const LedgerState& ledger, const torch::nn::Module& module) {
  auto it = ledger.names.find(&module);
  if (it == ledger.names.end() || it->second.empty()) return module.name();
  return it->second + " (" + module.name() + ")";
}

std::string region_name(LedgerState& ledger, const events::RegionBegun& event) {
  if (event.module != nullptr) return module_label(ledger, *event.module);
  if (event.state_modules == nullptr || event.state_modules->empty())
    return "checkpoint #" + std::to_string(++ledger.unnamed);
  std::string name = "checkpoint(";
  for (std::size_t i = 0; i < event.state_modules->size(); ++i) {
    if (i != 0) name += ", ";
    const auto& m = (*event.state_modules)[i];
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

// The row's mode and swap_inputs for a checkpointed region's `event`.
void set_region_mode(LedgerRegion& region, const events::RegionBegun& event) {
  region.mode = event.kind == events::RegionKind::CustomContexts ? LedgerMode::CustomContexts
                : event.kind == events::RegionKind::Selective    ? LedgerMode::Selective
                                                                 : LedgerMode::Full;
  region.swap_inputs = event.swap_inputs;
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

// A new row for `event`, its forward beginning now. Under no lock.
std::shared_ptr<LedgerRow> new_row(LedgerState& ledger, const events::RegionBegun& event,
                                   const LedgerRow* enclosing) {
  auto row = std::make_shared<LedgerRow>();
  row->ledger = std::static_pointer_cast<LedgerState>(ledger.shared_from_this());
  row->region.depth = enclosing != nullptr ? enclosing->region.depth + 1 : 0;
  if (event.kind == events::RegionKind::OffloadCall) {
    row->offload_module = event.module;
    row->region.mode = LedgerMode::Offload;
    row->region.checkpointed = false;
  } else {
    set_region_mode(row->region, event);
  }
  if (event.module != nullptr) note_plan(*row, *event.module);
  std::lock_guard lock(ledger.mutex);
  row->region.name = region_name(ledger, event);
  row->index = static_cast<int>(ledger.rows.size());
  ledger.rows.push_back(row);
  ledger_sample(ledger, "forward begin", row.get());
  return row;
}

}  // namespace

std::shared_ptr<void> LedgerState::region_begun(const events::RegionBegun& event, void* enclosing) {
  // Rows are the step's forward regions: none for a region begun in a recomputation.
  if (event.in_recomputation) return nullptr;
  auto* outer = static_cast<LedgerRow*>(enclosing);
  if (event.kind != events::RegionKind::OffloadCall && event.module != nullptr &&
      outer != nullptr && outer->offload_module == event.module) {
    // The region of a module whose offloaded call began just now: one row for both.
    std::lock_guard lock(mutex);
    outer->offload_module = nullptr;
    outer->region.checkpointed = true;
    set_region_mode(outer->region, event);
    outer->region.offloaded = true;
    return outer->shared_from_this();
  }
  return new_row(*this, event, outer);
}

void LedgerState::inputs_saved(void* region, events::InputsSaved how,
                               const std::vector<at::Tensor>& inputs) {
  LedgerRow& row = row_of(region);
  std::lock_guard lock(mutex);
  row.region.inputs = how == events::InputsSaved::Held        ? LedgerInputs::Held
                      : how == events::InputsSaved::Enclosing ? LedgerInputs::EnclosingRegion
                                                              : LedgerInputs::OuterPolicy;
  if (how != events::InputsSaved::Held) return;
  // As the meter counts saved tensors: by storage, parameters not at all. Inputs are held until
  // backward; their entries are never refunded (an entry whose storage died is reused).
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || !t.has_storage() || is_parameter_like(t)) continue;
    add_use(*this, row, t.storage().unsafeGetStorageImpl(),
            static_cast<int64_t>(t.storage().nbytes()));
  }
  row.input_bytes = row.live;  // nothing else is charged to the row before its inputs
}

void LedgerState::forward_ended(void* region, const std::exception_ptr& error) {
  LedgerRow& row = row_of(region);
  if (error) ledger_explain_oom(error, row, /*in_backward=*/false);
  std::lock_guard lock(mutex);
  row.offload_module = nullptr;  // ended: no region takes it over now
  row.region.bytes_held = row.live;
  // A region inside an offloaded call of its module shares the call's row: the region's end is
  // sampled (before the call's post-hook launches its copies); the call's end only counts again.
  if (row.end_sampled) return;
  row.end_sampled = true;
  ledger_sample(*this, "forward end", &row);
}

std::shared_ptr<void> LedgerState::bytes_charged(void* region, const at::Tensor& tensor,
                                                 int64_t bytes) {
  LedgerRow& row = row_of(region);
  c10::StorageImpl* storage = nullptr;
  if (tensor.defined()) {
    storage = tensor.storage().unsafeGetStorageImpl();
    bytes = static_cast<int64_t>(tensor.storage().nbytes());
  }
  {
    std::lock_guard lock(mutex);
    add_use(*this, row, storage, bytes);
  }
  return std::make_shared<LedgerCharge>(row.shared_from_this(), storage, bytes);
}

void LedgerState::rebuild_begun(void* region) {
  std::lock_guard lock(mutex);
  ledger_sample(*this, "rebuild begin", &row_of(region));
}

void LedgerState::rebuild_ended(void* region, bool reran, int64_t host_ns,
                                const std::exception_ptr& error) {
  LedgerRow& row = row_of(region);
  if (error) ledger_explain_oom(error, row, /*in_backward=*/true);
  std::lock_guard lock(mutex);
  LedgerRegion& r = row.region;
  ++r.rebuilds;
  if (reran) ++r.reruns;
  r.host_ns += host_ns;
  ledger_sample(*this, "rebuild end", &row);
}

void LedgerState::replayed(void* region, const events::ReplayOutcome& outcome) {
  std::lock_guard lock(mutex);
  LedgerRegion& r = row_of(region).region;
  if (!outcome.replayed) {
    r.fallback_reason = outcome.fallback_reason;
    return;
  }
  ++r.replays;
  r.ops_run += outcome.ops_run;
  r.ops_skipped += outcome.ops_skipped;
  r.ops_substituted += outcome.ops_substituted;
  r.draws_written += outcome.draws_written;
  r.writes_carried += outcome.writes_carried;
}

void LedgerState::policy_unmatched(void* region, const std::vector<std::string>& names) {
  std::lock_guard lock(mutex);
  row_of(region).region.unmatched_policy_names = names;
}

void LedgerState::copy_launched(void* region, const events::CopyLaunched& copy) {
  std::lock_guard lock(mutex);
  copy_level.in_flight += copy.bytes;
  copy_level.on_host += copy.direction == events::CopyDirection::ToHost ? copy.bytes : -copy.bytes;
  copy_level.time_ns = ledger_now_ns();
  copy_levels.push_back(copy_level);
  LedgerSwap& swap = row_of(region).region.swap;
  if (copy.direction == events::CopyDirection::ToHost) {
    ++swap.tensors_offloaded;
    swap.bytes_offloaded += copy.bytes;
    swap.offload_wait_ns += copy.host_wait_ns;
    return;
  }
  ++swap.tensors_reloaded;
  swap.bytes_reloaded += copy.bytes;
  swap.reload_wait_ns += copy.host_wait_ns;
  if (copy.cause == events::CopyCause::Prefetch) ++swap.prefetched;
  if (copy.cause == events::CopyCause::OnDemand) ++swap.sync_loads;
}

void LedgerState::copy_landed(void* region, const events::CopyLanded& copy) {
  std::lock_guard lock(mutex);
  const int64_t now = ledger_now_ns();
  copies.push_back({row_of(region).index, copy.direction, copy.bytes, now - copy.ns, now});
  copy_level.in_flight -= copy.bytes;
  copy_level.time_ns = now;
  copy_levels.push_back(copy_level);
  LedgerSwap& swap = row_of(region).region.swap;
  if (copy.direction == events::CopyDirection::ToHost) {
    swap.bytes_to_host_landed += copy.bytes;
    swap.to_host_ns += copy.ns;
  } else {
    swap.bytes_to_device_landed += copy.bytes;
    swap.to_device_ns += copy.ns;
  }
}

void LedgerState::reload_late(void* region, int64_t wait_ns) {
  std::lock_guard lock(mutex);
  LedgerSwap& swap = row_of(region).region.swap;
  ++swap.late_reloads;
  swap.reload_wait_ns += wait_ns;
}

void LedgerState::kept(void* region, events::KeptReason reason, int64_t bytes) {
  std::lock_guard lock(mutex);
  auto& kept = row_of(region).region.kept;
  const char* name = events::to_string(reason);
  auto it =
      std::find_if(kept.begin(), kept.end(), [&](const LedgerKept& k) { return k.reason == name; });
  if (it == kept.end()) it = kept.insert(kept.end(), LedgerKept{name, 0, 0});
  it->tensors += 1;
  it->bytes += bytes;
}

void LedgerState::mark(const std::string& label) {
  std::lock_guard lock(mutex);
  ledger_sample(*this, "mark", nullptr, label);
}

}  // namespace detail

StepLedger::StepLedger() {
  if (detail::open_ledger() != nullptr) {
    throw CheckpointError(
        "recompose: StepLedger: a ledger is alive on this thread already; one ledger per thread "
        "at a time (destroy the first before making another)");
  }
  state_ = std::make_shared<State>();
  state_->listen();
  detail::t_ledger = state_;
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
  state_->close();
  if (detail::t_ledger == state_) detail::t_ledger.reset();  // elsewhere: reset there on next use
  {
    // Rows and storage entries point at each other and at the state: break the cycles. Rows kept
    // by frames live on, unread.
    std::lock_guard lock(state_->mutex);
    state_->rows.clear();
    state_->storages.clear();
    state_->samples.clear();
    state_->copies.clear();
    state_->copy_levels.clear();
  }
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
  if (events::listening()) events::mark(label);
}

}  // namespace recompose
