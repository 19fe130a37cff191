// Command line of sharded_trainer. The launcher and every rank parse the same arguments; the
// launcher adds --rank, --store and --launcher-pid when it starts a rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sharded {

struct Options {
  int world = 2;
  int steps = 5;
  std::string checkpoint = "none";           // none | full
  std::string optim = "sgd";                 // sgd | adam
  std::string hook_order = "trainer-first";  // trainer-first | checkpoint-first
  bool offload =
      false;  // apply_offload on the blocks (those the all-gather hooks and checkpointing sit on)
  std::string device = "cpu";    // cpu | cuda: parameters, shards, activations
  std::string backend = "gloo";  // gloo | nccl (nccl: --device cuda, one GPU per rank)
  bool check = false;
  int blocks = 4;
  int64_t width = 64;
  int64_t hidden = 256;
  int64_t batch = 16;  // per rank
  double lr = 0.05;
  uint64_t seed = 0;
  int timeout_s = 120;  // launcher deadline for the whole run
  // Set by the launcher for a rank process.
  int rank = -1;
  std::string store;
  long launcher_pid = 0;
};

// Throws std::invalid_argument with a usage hint on bad input (also --backend nccl without
// --device cuda). Whether this build and machine can run the device and backend is checked by
// check_device_support (device.h).
Options parse_options(const std::vector<std::string>& args);
std::string usage();

}  // namespace sharded
