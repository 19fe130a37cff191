// Starts the ranks of a run as child processes of this program and waits for them, torchrun-like
// but on one machine: fork + exec of /proc/self/exe with the same arguments plus
// --rank r --store <FileStore path> --launcher-pid <pid>.
#pragma once

#include <string>
#include <vector>

namespace sharded {

// Runs `world` ranks and returns the exit code of the run: 0 when every rank exited 0, else the
// first failing rank's code (128 + signal for a killed one), 124 after `timeout_s` seconds.
// Fails fast: when one rank fails, the others are killed rather than left waiting for it in a
// collective. The rendezvous folder (mkdtemp under $TMPDIR or /tmp) is removed in every case,
// also when the launcher gets SIGINT or SIGTERM.
int launch_ranks(int world, const std::vector<std::string>& args, int timeout_s);

// In a rank: die with the launcher (SIGKILL when it exits), so that no rank outlives the run.
// Throws std::runtime_error if the launcher is already gone.
void die_with_launcher(long launcher_pid);

}  // namespace sharded
