#include "options.h"

#include "offload_link.h"

#include <recompose/planner.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <sstream>
#include <string_view>
#include <system_error>

#ifndef RECOMPOSE_GPT_DATA
#define RECOMPOSE_GPT_DATA "examples/gpt/data/alice.txt"
#endif

namespace gpt {
namespace {

template <class T>
T parse_number(std::string_view flag, std::string_view text, T min) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw UsageError(std::string(flag) + " expects a number, got '" + std::string(text) + "'");
  }
  if (value < min) {
    std::ostringstream s;
    s << flag << " must be at least " << min << ", got " << text;
    throw UsageError(s.str());
  }
  return value;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  o.data = RECOMPOSE_GPT_DATA;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "-h" || flag == "--help") {
      o.help = true;
    } else if (flag == "--compare") {
      o.compare = true;
    } else if (flag == "--policies") {
      // none first: --compare's ratios and its loss check are against it.
      o.policies = {Policy::None};
      const std::string_view list = value();
      for (size_t from = 0; from <= list.size();) {
        const size_t comma = std::min(list.find(',', from), list.size());
        const std::string_view name = list.substr(from, comma - from);
        const auto p = parse_policy(name);
        if (!p) {
          throw UsageError("--policies: '" + std::string(name) +
                           "' is not none, full, selective, swap, offload, every-second-mm or "
                           "offload-window");
        }
        if (std::find(o.policies.begin(), o.policies.end(), *p) == o.policies.end())
          o.policies.push_back(*p);
        from = comma + 1;
      }
    } else if (flag == "--budget") {
      o.budget = value();
      try {
        recompose::Budget::parse(o.budget);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--budget: ") + e.what());
      }
    } else if (flag == "--plan") {
      o.plan = value();
    } else if (flag == "--sweep") {
      o.sweep = true;
    } else if (flag == "--sweep-peak") {
      o.sweep = o.sweep_peak = true;
    } else if (flag == "--link") {
      o.link = value();
      try {
        if (o.link != "measure") parse_link(o.link);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--link: ") + e.what());
      }
    } else if (flag == "--offload-window-ms") {
      o.offload_window_ms = parse_number<double>(flag, value(), 0.0);
    } else if (flag == "--memory-fraction") {
      o.memory_fraction = parse_number<double>(flag, value(), 0.0);
      if (o.memory_fraction > 1.0) throw UsageError("--memory-fraction must be at most 1");
    } else if (flag == "--policy") {
      auto name = value();
      auto p = parse_policy(name);
      if (!p) {
        throw UsageError(
            "--policy must be none, full, selective, swap, offload, every-second-mm or "
            "offload-window, got '" +
            std::string(name) + "'");
      }
      o.policy = *p;
    } else if (flag == "--device") {
      o.device = value();
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
        throw UsageError("--device must be auto, cpu or cuda, got '" + o.device + "'");
      }
    } else if (flag == "--bf16") {
      o.bf16 = true;
    } else if (flag == "--phase-times") {
      o.phase_times = true;
    } else if (flag == "--profile") {
      o.profile_steps = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--ledger") {
      o.ledger = true;
    } else if (flag == "--no-meter") {
      o.no_meter = true;
    } else if (flag == "--steps") {
      o.steps = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--layers") {
      o.layers = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--width") {
      o.width = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--heads") {
      o.heads = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--context") {
      o.context = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--batch") {
      o.batch = parse_number<int64_t>(flag, value(), 1);
    } else if (flag == "--lr") {
      o.lr = parse_number<double>(flag, value(), 0.0);
    } else if (flag == "--dropout") {
      o.dropout = parse_number<double>(flag, value(), 0.0);
      if (o.dropout >= 1.0) throw UsageError("--dropout must be below 1");
    } else if (flag == "--seed") {
      o.seed = parse_number<uint64_t>(flag, value(), 0);
    } else if (flag == "--threads") {
      o.threads = parse_number<int64_t>(flag, value(), 0);
    } else if (flag == "--sample") {
      o.sample = parse_number<int64_t>(flag, value(), 0);
    } else if (flag == "--data") {
      o.data = value();
    } else if (flag == "--out") {
      o.out = value();
    } else if (flag == "--save-initial-state") {
      o.save_initial_state = value();
    } else {
      throw UsageError("unknown flag '" + std::string(flag) + "'");
    }
  }
  if (static_cast<int>(o.compare) + static_cast<int>(o.sweep) +
          static_cast<int>(!o.budget.empty()) + static_cast<int>(!o.plan.empty()) >
      1) {
    throw UsageError("--compare, --sweep, --budget and --plan exclude each other");
  }
  if (o.compare && o.memory_fraction > 0) {
    throw UsageError(
        "--memory-fraction caps the whole process, and --compare holds every policy's model in "
        "it: run one policy per process under a cap");
  }
  if (o.width % o.heads != 0) {
    throw UsageError("--width (" + std::to_string(o.width) + ") must be a multiple of --heads (" +
                     std::to_string(o.heads) + ")");
  }
  return o;
}

std::string usage(const char* program) {
  const Options d;
  std::ostringstream s;
  s << "Usage: " << program << " [flags]\n"
    << "Trains a small character-level GPT on a public-domain text, with activation "
       "checkpointing.\n\n"
    << "  --policy none|full|selective|swap|offload|every-second-mm|offload-window\n"
    << "                       checkpointing of every block (default none)\n"
    << "  --budget B           plan per block for at most B held for backward (\"40%\" of no "
       "checkpointing,\n"
    << "                       or bytes: \"12MiB\"), train under the plan; the plan goes to "
       "OUT/plan.json\n"
    << "  --plan FILE          train under a saved plan (JSON from --budget), without profiling\n"
    << "  --sweep              budgets from the least a plan holds to 100%, beside every policy, "
       "trained\n"
    << "                       side by side for --steps steps: OUT/sweep.csv and OUT/sweep.svg\n"
    << "  --budget peak=20GiB  plan for a peak of device memory for the whole step (weights, "
       "gradients,\n"
    << "                       optimizer state, temporaries and activations)\n"
    << "  --sweep-peak         the sweep with budgets of peak device memory (50% to 100% of no "
       "checkpointing's)\n"
    << "  --link measure|D2H,H2D,COST  the device <-> host link (bytes/s each way, seconds per "
       "copy) for the\n"
    << "                       planner's copy windows and offload-window (default: measured on "
       "CUDA)\n"
    << "  --offload-window-ms X  offload-window's forward window per block (default: each call's "
       "host time)\n"
    << "  --memory-fraction F  cap the CUDA caching allocator at F of the device's memory\n"
    << "  --compare            run the same steps under every policy and print one table;\n"
    << "                       exits 1 when the losses differ\n"
    << "  --policies A,B,...   the policies --compare trains (default all; none is always "
       "first)\n"
    << "  --device auto|cpu|cuda   (default auto: CUDA when available)\n"
    << "  --bf16               forward under CUDA autocast to bfloat16 (needs --device cuda)\n"
    << "  --phase-times        time forward, backward and the optimizer apart (synchronises "
       "between them)\n"
    << "  --profile N          the last N steps under LibTorch's Kineto profiler: a Chrome trace "
       "in\n"
       "                       OUT, and per phase (forward, backward, selective replays) the\n"
       "                       top-level ops' host time, device time, synchronisations\n"
    << "  --ledger             every step under a recompose::StepLedger; the last step's ledger\n"
       "                       printed after training and written to OUT/ledger.json,\n"
       "                       its memory timeline to OUT/ledger-timeline.svg, its\n"
       "                       allocations to OUT/memory-snapshot.pickle (pytorch.org/memory_viz)\n"
    << "  --no-meter           do not count the bytes held for backward (SavedTensorMeter's "
       "hooks)\n"
    << "  --steps N            training steps (default " << d.steps << ")\n"
    << "  --layers N           transformer blocks (default " << d.layers << ")\n"
    << "  --width N            embedding width (default " << d.width << ")\n"
    << "  --heads N            attention heads, divides --width (default " << d.heads << ")\n"
    << "  --context N          characters per sequence (default " << d.context << ")\n"
    << "  --batch N            sequences per step (default " << d.batch << ")\n"
    << "  --lr X               AdamW learning rate (default " << d.lr << ")\n"
    << "  --dropout X          dropout probability (default " << d.dropout << ")\n"
    << "  --seed N             seed of the weights, dropout and batches (default " << d.seed
    << ")\n"
    << "  --threads N          CPU threads, 0 for one per core (default " << d.threads << ")\n"
    << "  --sample N           characters to generate after training, 0 for none (default "
    << d.sample << ")\n"
    << "  --data FILE          training text (default " << RECOMPOSE_GPT_DATA << ")\n"
    << "  --out DIR            where the loss CSV and SVG go (default " << d.out.string() << ")\n"
    << "  --save-initial-state FILE  write the initial weights and RNG state for torch.load\n"
    << "                       (the Python peer, examples/gpt/python, trains from them)\n";
  return s.str();
}

}  // namespace gpt
