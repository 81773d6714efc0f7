// Helpers for the integration tests: temporary directories, a real hsdpd
// subprocess from this build (HSDP_BIN_DIR), shell commands, forked child
// processes that report through a pipe, and Status via `hsdpctl --json`.
//
// Fork rule: a test forks its client processes before it uses gRPC itself
// (fork + exec of hsdpd/hsdpctl is always fine).
#ifndef HSDP_TESTS_INTEGRATION_TEST_UTIL_H_
#define HSDP_TESTS_INTEGRATION_TEST_UTIL_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/spawn.h"  // SpawnLogged
#include "common/wait.h"   // Eventually, EventuallyValue
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/v1/admin.grpc.pb.h"
#include "hsdp/v1/admin.pb.h"

namespace hsdp::testing {

// $HSDP_BIN_DIR when set (a bundle carried to a GPU machine: the build's
// folder does not exist there), else this build's bin/.
inline std::string BinDir() {
  const char* env = std::getenv("HSDP_BIN_DIR");
  return env != nullptr && *env != 0 ? env : HSDP_BIN_DIR;
}

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

inline bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hsdp-it.XXXXXX";
    path_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
  }
  ~TempDir() {
    if (!path_.empty()) {
      const std::string cmd = "rm -rf '" + path_ + "'";
      (void)std::system(cmd.c_str());
    }
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Waits for `pid` up to `timeout_ms`; returns the exit code, 128 + signal,
// or -1 on timeout (the process is left running).
// -2 when `pid` is not a child of this process.
inline int WaitExit(pid_t pid, int timeout_ms) {
  return EventuallyValue(
      [pid] {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return r < 0 ? -2 : -1;
      },
      [](int rc) { return rc != -1; }, timeout_ms, /*poll_ms=*/5);
}

// A private hsdpd. Its stderr goes to <dir>/hsdpd.log.
class DaemonProcess {
 public:
  explicit DaemonProcess(const TempDir& dir) : dir_(dir.path()) {
    socket_ = dir_ + "/hsdpd.sock";
    log_ = dir_ + "/hsdpd.log";
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      WaitExit(pid_, 5000);
    }
  }

  // Starts `hsdpd --socket S [--node-config F] args...` with `env` added
  // ("K=V"). With `wait_ready`, returns once the socket accepts
  // connections (false if the daemon exited or never listened).
  bool Start(const std::string& config_yaml = "", std::vector<std::string> args = {},
             std::vector<std::string> env = {}, bool wait_ready = true) {
    std::vector<std::string> argv = {BinDir() + "/hsdpd", "--socket", socket_, "--log-level",
                                     "info"};
    if (!config_yaml.empty()) {
      const std::string cfg = dir_ + "/node.yaml";
      WriteFile(cfg, config_yaml);
      argv.push_back("--node-config");
      argv.push_back(cfg);
    }
    for (auto& a : args) argv.push_back(a);
    pid_ = SpawnLogged(argv, log_, Lifetime::kIndependent, env);
    if (pid_ <= 0) return false;
    if (!wait_ready) return true;
    return WaitReady(10000);
  }

  // False when the daemon exited first or never listened in time.
  bool WaitReady(int timeout_ms) {
    bool exited = false;
    const bool ready = Eventually(
        [&] {
          if (Exists(socket_) && ConnectUnix(socket_).ok()) return true;
          int status;
          exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
          return exited;
        },
        timeout_ms, /*poll_ms=*/10);
    if (exited) pid_ = -1;
    return ready && !exited;
  }

  // SIGTERM; returns the exit code (or -1 if it did not exit in time).
  int Stop(int timeout_ms = 15000) {
    if (pid_ <= 0) return -3;
    ::kill(pid_, SIGTERM);
    const int rc = WaitExit(pid_, timeout_ms);
    if (rc != -1) pid_ = -1;
    return rc;
  }
  // Waits for the daemon to exit by itself; its exit code, -1 on timeout.
  int WaitForExit(int timeout_ms) {
    if (pid_ <= 0) return -3;
    const int rc = WaitExit(pid_, timeout_ms);
    if (rc != -1) pid_ = -1;
    return rc;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    WaitExit(pid_, 5000);
    pid_ = -1;
  }
  bool Alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0 && WaitExit(pid_, 0) == -1; }

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  std::string Log() const { return ReadFile(log_); }

 private:
  std::string dir_;
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `cmd` with /bin/sh; captures stdout+stderr.
inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string Hsdpctl(const std::string& socket, const std::string& args) {
  return BinDir() + "/hsdpctl --socket '" + socket + "' " + args;
}

// The daemon's Status, via `hsdpctl --json status` parsed into the proto.
inline bool QueryStatus(const std::string& socket, v1::StatusResponse* out,
                        std::string* error = nullptr) {
  CommandResult r = RunCommand(Hsdpctl(socket, "--json status") + " 2>/dev/null");
  if (r.exit_code != 0) {
    if (error) *error = r.output;
    return false;
  }
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  auto s = google::protobuf::util::JsonStringToMessage(r.output, out, o);
  if (!s.ok() && error) *error = s.ToString() + ": " + r.output;
  return s.ok();
}

inline int CountSessions(const std::string& socket, const std::string& job = "") {
  v1::StatusResponse st;
  if (!QueryStatus(socket, &st)) return -1;
  int n = 0;
  for (const auto& s : st.sessions()) n += job.empty() || s.job_id() == job;
  return n;
}

// The operations of `job` that the daemon on `socket` holds right now
// (summed over its groups, from the Activity RPC): `pending` queued until
// every local member submitted, `running` handed to the engine. Both -1
// when the daemon does not answer.
struct JobOps {
  int64_t pending = -1;
  int64_t running = -1;
};
inline JobOps JobOpsInDaemon(const std::string& socket, const std::string& job) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto admin = v1::Admin::NewStub(
      grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ActivityResponse act;
  if (!admin->Activity(&ctx, v1::ActivityRequest(), &act).ok()) return {};
  JobOps n{0, 0};
  for (const auto& j : act.jobs()) {
    if (j.job_id() != job) continue;
    for (const auto& g : j.groups()) {
      n.pending += static_cast<int64_t>(g.pending());
      n.running += static_cast<int64_t>(g.running());
    }
  }
  return n;
}

// The operations of `job` the daemon holds, queued or running, or -1 when
// it does not answer. A test waits on this, never on a sleep, for "the
// trainer's operation has reached the daemon".
inline int64_t OpsInDaemon(const std::string& socket, const std::string& job) {
  const JobOps n = JobOpsInDaemon(socket, job);
  return n.pending < 0 ? -1 : n.pending + n.running;
}

// A forked child process running `body(out)`; whatever it writes to `out`
// (a pipe) comes back to the parent. Its return value is the exit code. The
// destructor kills a child that was not reaped. Waited on with WaitFor and
// Finish (blocking), or polled with Drain and TryReap (never blocking).
class Child {
 public:
  using Body = std::function<int(FILE* out)>;
  explicit Child(const Body& body) {
    int p[2];
    if (::pipe(p) != 0) return;
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(p[0]);
      FILE* out = ::fdopen(p[1], "w");
      std::setvbuf(out, nullptr, _IOLBF, 0);
      const int rc = body(out);
      std::fflush(out);
      std::fflush(nullptr);
      _exit(rc);
    }
    ::close(p[1]);
    fd_ = p[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      WaitExit(pid_, 5000);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  Child(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Waits until the child's output contains `text` (true) or `timeout_ms`
  // passes or the child closes its output (false).
  bool WaitFor(const std::string& text, int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (output_.find(text) == std::string::npos) {
      const int64_t left = deadline - NowMs();
      if (left <= 0 || !ReadSome(static_cast<int>(left))) return output_.find(text) != std::string::npos;
    }
    return true;
  }

  // Reads all output and reaps the child: exit code, 128 + signal, or -1
  // after `timeout_ms` (then the child is killed).
  int Finish(int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (NowMs() < deadline && ReadSome(static_cast<int>(deadline - NowMs()))) {
    }
    int rc = WaitExit(pid_, static_cast<int>(std::max<int64_t>(0, deadline - NowMs())));
    if (rc == -1) {
      ::kill(pid_, SIGKILL);
      WaitExit(pid_, 5000);
      output_ += "\n[test] child timed out and was killed\n";
    }
    reaped_ = true;
    return rc;
  }

  // Appends the output written so far, without blocking.
  void Drain() {
    while (ReadSome(0)) {
    }
  }

  // Reaps the child if it has exited, without blocking: its exit code or
  // 128 + signal; -1 while it runs (or when it cannot be waited for).
  int TryReap() {
    if (reaped_) return rc_;
    if (pid_ <= 0) return -1;  // waitpid(-1) would reap any child
    const int rc = WaitExit(pid_, 0);
    if (rc < 0) return -1;
    reaped_ = true;
    rc_ = rc;
    return rc;
  }

  void Kill(int sig = SIGKILL) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  const std::string& output() const { return output_; }

 private:
  // False on EOF or timeout.
  bool ReadSome(int timeout_ms) {
    if (fd_ < 0) return false;
    struct pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n <= 0) {
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  int rc_ = -1;  // once reaped by TryReap
  std::string output_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_TEST_UTIL_H_
