// inspect_policy: a region's forward run once plainly (every op recorded as the selective
// machinery would classify it, and the bytes autograd holds) and once as a checkpointed region
// with the policy (what the policy decided, and the bytes the region holds), the module's buffers
// and the RNG state put back after each run.
#include "dispatch_interceptor.h"
#include "engine/format_bytes.h"
#include "engine/model_state_guard.h"
#include "engine/tensor_accounting.h"
#include "op_names.h"
#include "op_traits.h"
#include "policy_warnings.h"

#include <recompose/checkpoint_error.h>
#include <recompose/policy_report.h>
#include <recompose/region_run.h>
#include <recompose/saved_tensor_meter.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace recompose {
namespace {

// Records every op of a plain forward as the selective machinery classifies it
// (caching_interceptor.cpp's CachingInterceptor): ignored ops left out, the others counted per
// overload, hidden from the policy when they alias or are autocast's parameter casts.
class OpRecorder final : public detail::OpInterceptor {
 public:
  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const detail::OpTraits& traits = detail::OpTraits::of(op);
    if (traits.ignored) {
      detail::run_below(op, stack);
      return;
    }
    PolicyReportOp rec;
    rec.op = detail::overload_name(op);
    rec.call_index = calls_[op]++;
    if (detail::autocast_cacheable_cast(traits, op, *stack)) {
      rec.why_hidden = "autocast parameter cast";
    } else if (traits.returns_alias) {
      rec.why_hidden = "view, in-place or out= op";
    } else {
      rec.shown_to_policy = true;
    }
    detail::run_below(op, stack);
    const size_t n_out = op.schema().returns().size();
    if (stack->size() >= n_out) {
      rec.output_bytes = detail::distinct_storage_bytes(
          c10::ArrayRef<c10::IValue>(stack->data() + (stack->size() - n_out), n_out),
          /*skip_parameter_like=*/false);
    }
    ops.push_back(std::move(rec));
  }

  std::vector<PolicyReportOp> ops;

 private:
  std::unordered_map<c10::OperatorHandle, int64_t> calls_;
};

using detail::format_bytes;

// The names of the policy's save list that no op shown to it matched. An op is reported as
// "name.overload" ("aten::max.default" for the overload without a name); a name without an
// overload names every overload.
std::vector<std::string> unmatched_names(const SelectivePolicy& policy,
                                         const std::vector<PolicyReportOp>& ops) {
  std::vector<std::string> shown;
  for (const PolicyReportOp& o : ops) {
    if (o.shown_to_policy) shown.push_back(o.op);
  }
  return detail::unmatched_op_names(policy.op_names(), shown);
}

const char* decision_name(const PolicyReportOp& op) {
  if (!op.shown_to_policy) return "always recomputed";
  if (op.swapped()) return "swapped";
  if (op.kept()) return "kept";
  return "recomputed";
}

enum class WarningKind { KeepsNothing, HoldsMore };

std::vector<std::pair<WarningKind, std::string>> warnings_of(const PolicyReport& r) {
  std::vector<std::pair<WarningKind, std::string>> out;
  if (r.keeps_nothing()) {
    out.emplace_back(
        WarningKind::KeepsNothing,
        "the policy keeps nothing in " + r.region +
            ": it is full checkpointing plus the cost of intercepting every op. Name ops the "
            "region "
            "runs (see the report's list of ops shown to the policy), or use plain checkpointing.");
  }
  if (r.holds_more_than_no_checkpointing()) {
    out.emplace_back(WarningKind::HoldsMore,
                     "the policy holds " + format_bytes(r.bytes_held_with_policy) +
                         " for backward in " + r.region + ", more than no checkpointing (" +
                         format_bytes(r.bytes_held_without_checkpointing) +
                         "): it keeps outputs that backward does not need. Keep fewer ops, or do "
                         "not checkpoint it.");
  }
  return out;
}

// Once per region label and kind of warning, in this process.
void warn_once(const PolicyReport& r) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, WarningKind>> warned;
  for (const auto& [kind, text] : warnings_of(r)) {
    {
      std::lock_guard lock(mutex);
      if (!warned.emplace(r.region, kind).second) continue;
    }
    TORCH_WARN("recompose::inspect_policy: ", text);
  }
}

}  // namespace

bool PolicyReportOp::kept() const {
  return shown_to_policy &&
         (decision == CheckpointPolicy::MUST_SAVE || decision == CheckpointPolicy::PREFER_SAVE);
}
bool PolicyReportOp::swapped() const {
  return shown_to_policy && decision == CheckpointPolicy::MUST_SWAP;
}

std::string PolicyReport::to_string() const {
  std::ostringstream out;
  out << "policy report: " << region << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %4s  %-40s %5s %12s  %-6s %s\n", "#", "op", "call", "output",
                "policy", "decision");
  out << line;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& o = ops[i];
    const std::string sees = o.shown_to_policy ? "sees" : "-";
    std::snprintf(line, sizeof line, "  %4zu  %-40s %5lld %12s  %-6s %s%s\n", i + 1, o.op.c_str(),
                  static_cast<long long>(o.call_index), format_bytes(o.output_bytes).c_str(),
                  sees.c_str(), decision_name(o),
                  o.shown_to_policy ? "" : (": " + o.why_hidden).c_str());
    out << line;
  }
  out << "  kept " << ops_kept << " op outputs (" << format_bytes(bytes_kept) << "), swapped "
      << ops_swapped << " (" << format_bytes(bytes_swapped) << "), recomputed " << ops_recomputed
      << " ops\n";
  out << "  held for backward: " << format_bytes(bytes_held_with_policy) << " with the policy, "
      << format_bytes(bytes_held_without_checkpointing) << " without checkpointing";
  if (bytes_held_without_checkpointing > 0) {
    std::snprintf(line, sizeof line, " (%.2fx)",
                  static_cast<double>(bytes_held_with_policy) /
                      static_cast<double>(bytes_held_without_checkpointing));
    out << line;
  }
  out << "; the region's inputs are not counted\n";
  if (!unmatched_names.empty()) {
    out << "  names in the policy that no op of this region matched (they keep nothing here):";
    for (const auto& name : unmatched_names) out << " " << name;
    out << "\n";
  }
  for (const auto& [kind, text] : warnings_of(*this)) out << "  warning: " << text << "\n";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const PolicyReport& report) {
  return out << report.to_string();
}

PolicyReport inspect_policy(const SelectivePolicy& policy, const std::function<void()>& forward,
                            const std::vector<std::shared_ptr<torch::nn::Module>>& state_modules,
                            const std::string& label) {
  if (!forward)
    throw std::invalid_argument("recompose::inspect_policy: the forward function is empty");
  torch::AutoGradMode grad_on(true);  // a policy is only asked where a region saves for backward
  PolicyReport report;
  report.region = label;
  // Each run leaves the modules' buffers, modes and generators as they were on entry (also when
  // the forward throws): the report changes nothing of what training computes.
  detail::ModelStateGuard state(state_modules,
                                detail::kModes | detail::kBuffers | detail::kGenerators);

  // 1. Plainly: every op, and what autograd holds without checkpointing.
  OpRecorder recorder;
  {
    SavedTensorMeter meter;
    {
      detail::InterceptorScope scope(recorder);
      forward();
    }
    report.bytes_held_without_checkpointing = meter.peak_bytes_held();
  }
  state.restore();

  // 2. As a region with the policy: the decisions, and what the region holds.
  std::map<std::pair<std::string, int64_t>, CheckpointPolicy> decisions;
  SelectivePolicy recording([&](const SelectiveCheckpointContext& ctx,
                                const c10::OperatorHandle& op, const torch::jit::Stack& args) {
    const CheckpointPolicy d = policy(ctx, op, args);
    decisions[{detail::overload_name(op), ctx.call_index}] = d;
    return d;
  });
  {
    detail::PolicyWarningsOff warnings_off;  // this report says the same with its own words
    SavedTensorMeter meter;
    auto options = CheckpointOptions().state_modules(state_modules);
    options.policy(recording);
    auto region = detail::RegionRun::begin(
        options, {}, [forward](const std::vector<at::Tensor>&) { forward(); });
    try {
      forward();
    } catch (...) {
      region.end(std::current_exception());
      throw;
    }
    region.end(nullptr);
    report.bytes_held_with_policy = meter.peak_bytes_held();
  }
  state.restore();

  for (auto& o : recorder.ops) {
    if (o.shown_to_policy) {
      auto it = decisions.find({o.op, o.call_index});
      if (it != decisions.end()) o.decision = it->second;
    }
    if (o.kept()) {
      ++report.ops_kept;
      report.bytes_kept += o.output_bytes;
    } else if (o.swapped()) {
      ++report.ops_swapped;
      report.bytes_swapped += o.output_bytes;
    } else {
      ++report.ops_recomputed;
    }
  }
  report.ops = std::move(recorder.ops);
  report.unmatched_names = unmatched_names(policy, report.ops);
  warn_once(report);
  return report;
}

}  // namespace recompose
