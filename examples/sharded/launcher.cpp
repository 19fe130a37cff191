#include "launcher.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace sharded {
namespace {

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Removes the rendezvous folder and whatever the store left in it (one flat level).
void remove_dir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  if (rmdir(dir.c_str()) != 0)
    std::fprintf(stderr, "launcher: could not remove %s: %s\n", dir.c_str(), strerror(errno));
}

void kill_all(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (p > 0) kill(p, SIGKILL);
}

}  // namespace

int launch_ranks(int world, const std::vector<std::string>& args, int timeout_s) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/recompose_sharded_XXXXXX";
  if (!mkdtemp(templ.data())) {
    std::fprintf(stderr, "launcher: mkdtemp(%s) failed: %s\n", templ.c_str(), strerror(errno));
    return 1;
  }
  const std::string dir = templ, store = dir + "/store";

  // Handled, not default: the launcher must live to kill the ranks and remove the folder.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  std::fflush(nullptr);  // or the children inherit unflushed output and print it twice
  const std::string self_pid = std::to_string(getpid());
  std::vector<pid_t> pids;
  int rc = 0;
  for (int r = 0; r < world && rc == 0; ++r) {
    std::vector<std::string> argv_s{"sharded_trainer"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    argv_s.insert(argv_s.end(),
                  {"--rank", std::to_string(r), "--store", store, "--launcher-pid", self_pid});
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "launcher: fork failed: %s\n", strerror(errno));
      rc = 1;
      break;
    }
    if (pid == 0) {
      std::vector<char*> av;
      for (auto& s : argv_s) av.push_back(s.data());
      av.push_back(nullptr);
      execv("/proc/self/exe", av.data());
      std::fprintf(stderr, "launcher: exec of /proc/self/exe failed: %s\n", strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
  }
  if (rc != 0) kill_all(pids);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool killed = rc != 0;
  int alive = int(pids.size());
  while (alive > 0) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, WNOHANG);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    if (p == 0) {
      if (!killed && g_stop_signal) {
        std::fprintf(stderr, "launcher: got signal %d, stopping the ranks\n", int(g_stop_signal));
        rc = 128 + g_stop_signal;
        killed = true;
        kill_all(pids);
      } else if (!killed && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr,
                     "launcher: the run passed its %d s deadline (--timeout), killing the ranks\n",
                     timeout_s);
        rc = 124;
        killed = true;
        kill_all(pids);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const auto it = std::find(pids.begin(), pids.end(), p);
    if (it == pids.end()) continue;
    const int rank = int(it - pids.begin());
    *it = -1;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && rc == 0) {
      rc = code;
      std::fprintf(stderr, "launcher: rank %d exited with %d; stopping the others\n", rank, code);
      killed = true;
      kill_all(pids);
    }
  }
  remove_dir(dir);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return rc;
}

void die_with_launcher(long launcher_pid) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died between fork and prctl; then nobody would kill this rank.
  if (getppid() != launcher_pid)
    throw std::runtime_error("the launcher exited before this rank started");
}

}  // namespace sharded
