// glibc malloc settings for a training process; call tune_malloc_for_training() first thing in
// main().
//
// Why: a training step allocates and frees the same activations every step. With glibc's
// defaults, free() hands the top of the heap back to the kernel once more than 128 KiB (adapting
// up to 64 MiB) lie free there, and blocks above the mmap threshold (128 KiB, adapting up to
// 32 MiB) are mmapped and unmapped one by one; every step then faults its memory in again, page
// by page. Keeping freed memory in the process (no trimming) and serving blocks up to 32 MiB from
// the heap makes the step reuse it. GPT example, default model, CPU, 1 thread: 4,413 page faults
// per step with glibc's defaults, 351 with these settings, 759 for the same model trained by
// PyTorch in Python (docs/benchmarks/2026-11-22-cpu-2core-cpp-vs-python.txt).
//
// Cost: the process keeps its peak heap (it does not shrink after a large step), which is what a
// training loop reuses anyway. Blocks above 32 MiB (glibc's maximum mmap threshold) are still
// mmapped per allocation. RECOMPOSE_MALLOC_TUNING=0 leaves glibc's defaults (for measuring), and
// so does a GLIBC_TUNABLES that sets either threshold itself.
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace examples {

enum class MallocTuning { Applied, TurnedOff, FromTunables, NotGlibc };

inline MallocTuning tune_malloc_for_training() {
#if defined(__GLIBC__)
  const char* off = std::getenv("RECOMPOSE_MALLOC_TUNING");
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (off && std::strcmp(off, "0") == 0) return MallocTuning::TurnedOff;
  if (tunables &&
      (std::strstr(tunables, "trim_threshold") || std::strstr(tunables, "mmap_threshold"))) {
    return MallocTuning::FromTunables;  // the user chose: leave it
  }
  mallopt(M_TRIM_THRESHOLD, -1);                // never give the top of the heap back (man mallopt)
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);  // glibc's maximum; also fixes it (no adaptation)
  return MallocTuning::Applied;
#else
  return MallocTuning::NotGlibc;
#endif
}

inline const char* describe(MallocTuning t) {
  switch (t) {
    case MallocTuning::Applied:
      return "glibc malloc tuned for training (no trim, mmap above 32 MiB; "
             "RECOMPOSE_MALLOC_TUNING=0 turns it off)";
    case MallocTuning::TurnedOff:
      return "glibc malloc defaults (RECOMPOSE_MALLOC_TUNING=0)";
    case MallocTuning::FromTunables:
      return "glibc malloc thresholds from GLIBC_TUNABLES (left as set)";
    case MallocTuning::NotGlibc:
      return "system malloc (not glibc: left as is)";
  }
  return "";
}

}  // namespace examples
