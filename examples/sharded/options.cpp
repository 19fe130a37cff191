#include "options.h"

#include <stdexcept>

namespace sharded {

std::string usage() {
  return "usage: sharded_trainer [--world N] [--steps K] [--checkpoint none|full] [--offload] "
         "[--optim sgd|adam]\n"
         "                       [--hook-order trainer-first|checkpoint-first] [--check]\n"
         "                       [--device cpu|cuda] [--backend gloo|nccl]\n"
         "                       [--blocks L] [--width D] [--hidden H] [--batch B] [--lr X] "
         "[--seed S]\n"
         "                       [--timeout SECONDS]\n"
         "  Starts N ranks on this machine (c10d Gloo over 127.0.0.1, or NCCL with one GPU per "
         "rank); each\n"
         "  owns a shard of every block.\n"
         "  --offload: recompose::apply_offload on the blocks: what their forward saves goes to "
         "host memory.\n"
         "  --check: compare the final parameters, names and state_dict with single-process "
         "training.\n";
}

namespace {

long to_long(const std::string& flag, const std::string& v, long lo, long hi) {
  std::size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || x < lo || x > hi) {
    throw std::invalid_argument(flag + " wants an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got '" + v + "'");
  }
  return x;
}

std::string one_of(const std::string& flag, const std::string& v,
                   std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return v;
    list += list.empty() ? a : std::string("|") + a;
  }
  throw std::invalid_argument(flag + " wants " + list + ", got '" + v + "'");
}

}  // namespace

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& k = args[i];
    if (k == "--check" || k == "--offload") {
      (k == "--check" ? o.check : o.offload) = true;
      continue;
    }
    if (k == "--help" || k == "-h") throw std::invalid_argument("");
    if (i + 1 >= args.size()) throw std::invalid_argument(k + " needs a value (or is unknown)");
    const std::string& v = args[++i];
    if (k == "--world")
      o.world = int(to_long(k, v, 1, 64));
    else if (k == "--steps")
      o.steps = int(to_long(k, v, 1, 1000000));
    else if (k == "--checkpoint")
      o.checkpoint = one_of(k, v, {"none", "full"});
    else if (k == "--optim")
      o.optim = one_of(k, v, {"sgd", "adam"});
    else if (k == "--device")
      o.device = one_of(k, v, {"cpu", "cuda"});
    else if (k == "--backend")
      o.backend = one_of(k, v, {"gloo", "nccl"});
    else if (k == "--hook-order")
      o.hook_order = one_of(k, v, {"trainer-first", "checkpoint-first"});
    else if (k == "--blocks")
      o.blocks = int(to_long(k, v, 1, 1000));
    else if (k == "--width")
      o.width = to_long(k, v, 1, 1 << 16);
    else if (k == "--hidden")
      o.hidden = to_long(k, v, 1, 1 << 18);
    else if (k == "--batch")
      o.batch = to_long(k, v, 1, 1 << 20);
    else if (k == "--seed")
      o.seed = uint64_t(to_long(k, v, 0, 1L << 40));
    else if (k == "--timeout")
      o.timeout_s = int(to_long(k, v, 1, 86400));
    else if (k == "--rank")
      o.rank = int(to_long(k, v, 0, 63));
    else if (k == "--store")
      o.store = v;
    else if (k == "--launcher-pid")
      o.launcher_pid = to_long(k, v, 1, 1L << 30);
    else if (k == "--lr") {
      try {
        o.lr = std::stod(v);
      } catch (const std::exception&) {
        throw std::invalid_argument("--lr wants a number, got '" + v + "'");
      }
    } else {
      throw std::invalid_argument("unknown option '" + k + "'");
    }
  }
  if (o.backend == "nccl" && o.device != "cuda") {
    throw std::invalid_argument(
        "--backend nccl needs --device cuda (NCCL moves CUDA tensors only)");
  }
  if (o.rank >= o.world) throw std::invalid_argument("--rank must be below --world");
  if (o.rank >= 0 && o.store.empty())
    throw std::invalid_argument("--rank needs --store (set by the launcher)");
  return o;
}

}  // namespace sharded
