// Starting processes from tests and benchmarks: a fork whose child dies with
// this process, and a program run with its output in a log file. Header-only
// (tests include "common/spawn.h", tools "tests/common/spawn.h").
//
// PR_SET_PDEATHSIG fires when the forking *thread* exits, not the process:
// only a fork from the main thread ties the child to this process's life. A
// fork from another thread (a gRPC callback, a test's helper thread) is left
// untied rather than killed when that thread ends.
#ifndef HSDP_TESTS_COMMON_SPAWN_H_
#define HSDP_TESTS_COMMON_SPAWN_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace hsdp::testing {

// fork(); in the child (0 returned), a fork from the main thread is first
// tied to this process: SIGKILL when it dies, and exit 126 when it died
// before the tie took hold. Between this and exec only async-signal-safe
// calls belong in a child of a process with threads.
inline pid_t ForkTiedToParent() {
  const pid_t parent = ::getpid();
  const bool main_thread = ::gettid() == parent;
  const pid_t pid = ::fork();
  if (pid == 0 && main_thread) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(126);
  }
  return pid;
}

enum class Lifetime {
  kDiesWithParent,  // ForkTiedToParent
  kIndependent,     // a plain fork: the test or tool reaps or kills it itself
};

// Forks and execs `argv` (argv[0] a path) with stdout and stderr appended to
// `log` (created with `log_mode`) and `env` ("K=V") added to its
// environment. Returns the child's pid, or -1 when fork failed; a failed
// exec is exit code 127.
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log,
                         Lifetime lifetime = Lifetime::kDiesWithParent,
                         const std::vector<std::string>& env = {}, mode_t log_mode = 0644) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  const pid_t pid = lifetime == Lifetime::kDiesWithParent ? ForkTiedToParent() : ::fork();
  if (pid != 0) return pid;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, log_mode);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
  ::execv(a[0], a.data());
  _exit(127);
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_SPAWN_H_
