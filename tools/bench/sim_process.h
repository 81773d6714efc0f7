// The processes and measurements of hsdp-membership-sim: children that
// never outlive it (PR_SET_PDEATHSIG, killed at exit and on a signal),
// temporary folders, free ports, and what /proc and etcd's /metrics say
// (CPU seconds, fds, threads, gRPC counters).
#ifndef HSDP_TOOLS_BENCH_SIM_PROCESS_H_
#define HSDP_TOOLS_BENCH_SIM_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tests/common/ports.h"

namespace hsdp::sim {

// Children (at most 16 at a time) are remembered so that they can be killed.
void KillChild(pid_t pid);        // SIGKILL and reap
void KillAllChildren();           // every remembered child
void OnSignal(int sig);           // a signal handler: kills the children, re-raises
bool Exited(pid_t pid);           // reaped without waiting
// Starts `argv` with its stdout and stderr in `log` (SpawnLogged: from the
// main thread, it dies with this process) and remembers it. -1 on failure.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log);

class TempDir {
 public:
  TempDir();                                 // under /tmp
  explicit TempDir(const std::string& under);
  ~TempDir();                                // removes it and what is in it
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }  // "" when it could not be made
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A loopback port free a moment ago, never handed out twice (the tests' helper).
using ::hsdp::testing::FreePort;
std::string ReadFile(const std::string& path);
// The last `n` bytes of `s` ("..." first when cut).
std::string Tail(const std::string& s, size_t n);
// utime + stime of a process (or "self"), in seconds.
double CpuSeconds(const std::string& pid);
int CountFds();      // this process's open fds
int CountThreads();  // this process's threads
// GET http://127.0.0.1:port/path (HTTP/1.0): the body, "" on failure.
std::string HttpGet(int port, const std::string& path, absl::Duration timeout);

// etcd's gRPC counters from its /metrics.
struct EtcdCounters {
  double unary_handled = 0;    // finished unary calls
  double stream_received = 0;  // messages received on streams (keepalive, watch)
  double stream_sent = 0;      // messages sent on streams (watch events, keepalive answers)
  double watch_sent = 0;       // of which on Watch
  bool ok = false;
};
EtcdCounters Scrape(int port);

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_PROCESS_H_
