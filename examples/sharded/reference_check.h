// --check: the sharded run against single-process, unsharded, uncheckpointed training.
#pragma once

#include "model.h"
#include "options.h"

#include <string>
#include <vector>

namespace sharded {

// One line per check, "[ok]" or "[FAIL]", and the tally that decides the exit code.
class CheckTally {
 public:
  void expect(bool ok, const std::string& what);
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  int passed_ = 0, failed_ = 0;
};

struct Reference {
  MlpModel model{nullptr};
  std::vector<double> losses;  // per step, over the union of every rank's batch
};

// Trains a plain model (same init, no hooks, no sharding, no checkpointing) on the union of the
// batches of all `o.world` ranks, which is the same data seen by the sharded run, on the device
// the calling rank trains on (so that only the sharding differs, not the kernels' device).
Reference train_reference(const Options& o, const ModelConfig& c);

// Compares the sharded model (its parameters unsharded) with the reference and the plain model:
// fully-qualified parameter names, values within `tolerance`, per-step losses, and the keys and
// values of a state_dict saved with torch::save.
void compare_with_reference(const MlpModel& sharded, const std::vector<double>& sharded_losses,
                            const Reference& ref, const ModelConfig& c, double tolerance,
                            CheckTally& tally);

}  // namespace sharded
