// inspect_policy: a region's forward run once plainly (the bytes autograd holds) and once as a
// checkpointed region with the policy (what the policy decided, the bytes the region holds, and
// every op as the region's forward trace recorded it: its summary), the module's buffers and the
// RNG state put back after each run.
#include "engine/format_bytes.h"
#include "engine/model_state_guard.h"
#include "op_names.h"
#include "policy_warnings.h"
#include "summarizing_contexts.h"

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
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

namespace recompose {
namespace {

using detail::format_bytes;

constexpr const char* kAutocastCast = "autocast parameter cast";

// The report's rows: the region's ops as its forward trace classified them (the policy saw the
// ops that return new tensors), with the policy's decision for each it saw.
std::vector<PolicyReportOp> report_ops(
    const detail::ForwardSummary& summary,
    const std::map<std::pair<std::string, int64_t>, CheckpointPolicy>& decisions) {
  std::vector<PolicyReportOp> rows;
  rows.reserve(summary.ops.size());
  for (const detail::SummaryOp& e : summary.ops) {
    PolicyReportOp& row = rows.emplace_back();
    row.op = detail::overload_name(e.op);
    row.call_index = e.call_index;
    row.output_bytes = e.output_bytes;
    row.bytes_kept_for_replay = e.draw_bytes + e.kept_cast_bytes;
    switch (e.kind) {
      case detail::SummaryOp::Kind::Decided: {
        row.shown_to_policy = true;
        auto it = decisions.find({row.op, row.call_index});
        if (it != decisions.end()) row.decision = it->second;
        break;
      }
      case detail::SummaryOp::Kind::AutocastCast:
        row.why_hidden = kAutocastCast;
        break;
      case detail::SummaryOp::Kind::Write:
      case detail::SummaryOp::Kind::View:
        row.why_hidden = "view, in-place or out= op";
        break;
    }
  }
  return rows;
}

// The report's sums over its rows: what the policy kept, swapped and recomputed, and what the
// region kept for its replay beyond that (parameter casts, dropout draws).
void tally_ops(PolicyReport& report) {
  for (const PolicyReportOp& o : report.ops) {
    if (o.kept()) {
      ++report.ops_kept;
      report.bytes_kept += o.output_bytes;
    } else if (o.swapped()) {
      ++report.ops_swapped;
      report.bytes_swapped += o.output_bytes;
    } else {
      ++report.ops_recomputed;
    }
    if (o.bytes_kept_for_replay == 0) continue;
    const bool cast = o.why_hidden == kAutocastCast;
    (cast ? report.casts_kept_for_replay : report.draws_kept) += 1;
    (cast ? report.bytes_of_casts_kept : report.bytes_of_draws_kept) += o.bytes_kept_for_replay;
  }
}

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
  if (op.why_hidden == kAutocastCast && op.bytes_kept_for_replay > 0) return "kept for the replay";
  if (!op.shown_to_policy) return "always recomputed";
  if (op.swapped()) return "swapped";
  if (op.kept()) return "kept";
  if (op.bytes_kept_for_replay > 0) return "recomputed from its kept draw";
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
  if (casts_kept_for_replay > 0 || draws_kept > 0) {
    out << "  kept for the replay, whatever the policy: " << casts_kept_for_replay
        << " autocast parameter casts (" << format_bytes(bytes_of_casts_kept) << "), " << draws_kept
        << " dropout draws (" << format_bytes(bytes_of_draws_kept)
        << "): the replay neither casts nor draws them again\n";
  }
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
  if (replay_fallback_reason.empty()) {
    out << "  backward: the replay rebuilds what the policy dropped\n";
  } else {
    out << "  backward: runs the region's forward again: " << replay_fallback_reason << "\n";
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

  // 1. Plainly: what autograd holds without checkpointing.
  {
    SavedTensorMeter meter;
    forward();
    report.bytes_held_without_checkpointing = meter.peak_bytes_held();
  }
  state.restore();

  // 2. As a region with the policy: what the policy decided, what the region holds, and every
  // op as the region's forward trace classified it (its summary).
  std::map<std::pair<std::string, int64_t>, CheckpointPolicy> decisions;
  SelectivePolicy recording([&](const SelectiveCheckpointContext& ctx,
                                const c10::OperatorHandle& op, const torch::jit::Stack& args) {
    const CheckpointPolicy d = policy(ctx, op, args);
    decisions[{detail::overload_name(op), ctx.call_index}] = d;
    return d;
  });
  recording.keep_parameter_casts(policy.parameter_cast_budget());
  std::optional<detail::ForwardSummary> summary;
  {
    detail::PolicyWarningsOff warnings_off;  // this report says the same with its own words
    SavedTensorMeter meter;
    auto options = CheckpointOptions().state_modules(state_modules);
    options.context_fn([&recording, &summary] {
      return detail::create_summarizing_contexts(
          recording, /*allow_cache_entry_mutation=*/false,
          [&summary](detail::ForwardSummary&& s) { summary = std::move(s); });
    });
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
  if (!summary) {
    throw CheckpointError(
        "recompose::inspect_policy: the forward's region was never entered; nothing to "
        "report");
  }
  if (summary->failed) {
    throw CheckpointError(
        "recompose::inspect_policy: the region's forward could not be summarised (out of host "
        "memory); nothing to report");
  }

  report.ops = report_ops(*summary, decisions);
  tally_ops(report);
  report.unmatched_names = unmatched_names(policy, report.ops);
  report.replay_fallback_reason = summary->replay_fallback;
  warn_once(report);
  return report;
}

}  // namespace recompose
