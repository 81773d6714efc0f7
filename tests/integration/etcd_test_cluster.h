// A real etcd cluster for tests: N members (default 3) of the etcd binary
// that tools/scripts/etcd_env.sh extracted (HSDP_ETCD_BIN), on 127.0.0.1
// with free ports, each in its own data directory under a temporary
// directory, with fast raft timings (heartbeat 50 ms, election 500 ms) and
// its log in <dir>/m<i>.log. Members can be killed (SIGKILL) and restarted on
// the same ports and data. The destructor kills every member and never hangs
// (members started from the main thread also die with the test process:
// PR_SET_PDEATHSIG).
#ifndef HSDP_TESTS_INTEGRATION_ETCD_TEST_CLUSTER_H_
#define HSDP_TESTS_INTEGRATION_ETCD_TEST_CLUSTER_H_

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/ports.h"  // FreePort
#include "common/spawn.h"  // SpawnLogged
#include "daemon/cluster/etcd/etcd_client.h"
#include "test_util.h"

namespace hsdp::testing {

inline std::string EtcdBinary() { return HSDP_ETCD_BIN; }

inline std::string EtcdLoopback(int port) { return absl::StrCat("127.0.0.1:", port); }

inline std::string EtcdctlBinary() { return HSDP_ETCDCTL_BIN; }

class EtcdTestCluster {
 public:
  explicit EtcdTestCluster(int members = 3) : members_(members) {}
  ~EtcdTestCluster() { Stop(); }
  EtcdTestCluster(const EtcdTestCluster&) = delete;
  EtcdTestCluster& operator=(const EtcdTestCluster&) = delete;

  // Before Start: clients must use TLS (the server certificate `cert`/`key`,
  // signed by `ca`) and present a certificate `ca` signed
  // (--client-cert-auth). PEM paths.
  void UseTls(std::string ca, std::string cert, std::string key) {
    tls_ca_ = std::move(ca);
    tls_cert_ = std::move(cert);
    tls_key_ = std::move(key);
  }

  // Starts every member and waits until each answers a read (with a
  // leader). A member that cannot bind its port (another process took it
  // between FreePort and etcd's bind) fails the attempt: the whole cluster
  // is started again on new ports, up to three attempts.
  absl::Status Start(absl::Duration timeout = absl::Seconds(30)) {
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      Stop();
      dir_ = std::make_unique<TempDir>();
      if (dir_->path().empty()) return absl::InternalError("mkdtemp failed");
      nodes_.assign(members_, Node{});
      for (int i = 0; i < members_; ++i) {
        nodes_[i].client_port = FreePort();
        nodes_[i].peer_port = FreePort();
      }
      bool spawned = true;
      for (int i = 0; i < members_ && spawned; ++i) spawned = Spawn(i, /*existing=*/false);
      last = spawned ? WaitHealthy(timeout) : absl::InternalError("fork failed");
      if (last.ok()) return last;
      last = absl::Status(last.code(), absl::StrCat(last.message(), "; logs:\n", Logs()));
    }
    return last;
  }

  // "127.0.0.1:PORT" of every member's client URL.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int i = 0; i < members_; ++i) out.push_back(endpoint(i));
    return out;
  }
  std::string endpoint(int i) const { return EtcdLoopback(nodes_.at(i).client_port); }
  int size() const { return members_; }
  const std::string& dir() const { return dir_->path(); }
  bool alive(int i) const { return nodes_.at(i).pid > 0; }

  // SIGKILL, and reaps it.
  void Kill(int i) {
    Node& n = nodes_.at(i);
    if (n.pid <= 0) return;
    ::kill(n.pid, SIGKILL);
    WaitExit(n.pid, 10000);
    n.pid = -1;
  }

  // SIGSTOP / SIGCONT: a hung member (its connections stay open, nothing
  // answers).
  // SIGSTOP, and returns once every thread of the member has stopped: kill()
  // returns before the group stop completes, and on a loaded machine a thread
  // of the member could still answer a request sent just after it (CI saw a
  // renewal answered by a member "paused" an instant before).
  void Pause(int i) {
    const pid_t pid = nodes_.at(i).pid;
    if (pid <= 0) return;
    ::kill(pid, SIGSTOP);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!AllThreadsStopped(pid) && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void Resume(int i) {
    if (nodes_.at(i).pid > 0) ::kill(nodes_[i].pid, SIGCONT);
  }

  // Starts a killed member again: same ports, same data directory
  // (--initial-cluster-state existing). Does not wait; see WaitHealthy.
  bool Restart(int i) {
    Kill(i);
    return Spawn(i, /*existing=*/true);
  }

  // Kills every member.
  void Stop() {
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) Kill(i);
  }

  // Until every running member answers a read of its own (a member without
  // a leader refuses: the client sends "hasleader"). With auth enabled, as
  // root.
  //
  // The read is etcdctl's (`endpoint health`, a process of its own): gRPC
  // must not start in a test process that forks trainers later (its threads
  // do not survive fork, and a trainer's own gRPC calls could then hang), and
  // a child forked from a process whose gRPC runs could hang the same way.
  absl::Status WaitHealthy(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0; i < members_; ++i) {
      if (nodes_[i].pid <= 0) continue;
      std::string cmd = absl::StrCat("ETCDCTL_API=3 timeout 10 '", EtcdctlBinary(),
                                     "' --dial-timeout=1s --command-timeout=1s --endpoints=",
                                     endpoint(i), " ");
      if (!root_password_.empty()) absl::StrAppend(&cmd, "--user 'root:", root_password_, "' ");
      if (!tls_ca_.empty()) {
        absl::StrAppend(&cmd, "--cacert '", tls_ca_, "' --cert '", tls_cert_, "' --key '",
                        tls_key_, "' ");
      }
      // Polled until healthy, or until the member exited (no use waiting).
      bool exited = false;
      std::string last;
      const bool healthy = Eventually(
          [&] {
            exited = !Running(i);
            if (exited) return true;
            const CommandResult r = RunCommand(cmd + "endpoint health");
            last = r.output;
            return r.exit_code == 0;
          },
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()))),
          /*poll_ms=*/50);
      if (exited) {
        return absl::UnavailableError(
            absl::StrCat("etcd member ", i, " (", endpoint(i), ") exited"));
      }
      if (!healthy) {
        return absl::DeadlineExceededError(absl::StrCat(
            "etcd member ", i, " (", endpoint(i), ") not healthy in time: ", last));
      }
    }
    return absl::OkStatus();
  }

 public:
#ifdef HSDP_ETCDCTL_BIN
  // Adds user root with `password` and enables authentication (etcdctl).
  absl::Status EnableAuth(const std::string& password) {
    for (const std::string& args :
         {absl::StrCat("user add 'root:", password, "'"), std::string("auth enable")}) {
      absl::Status s = Etcdctl(args);
      if (!s.ok()) return s;
    }
    root_password_ = password;
    return absl::OkStatus();
  }

  // `etcdctl ARGS` against every member (as root once auth is enabled);
  // ARGS is shell text.
  absl::Status Etcdctl(const std::string& args) {
    std::string cmd = absl::StrCat("ETCDCTL_API=3 timeout 30 '", EtcdctlBinary(),
                                   "' --command-timeout=10s --endpoints=",
                                   absl::StrJoin(endpoints(), ","), " ");
    if (!root_password_.empty()) absl::StrAppend(&cmd, "--user 'root:", root_password_, "' ");
    CommandResult r = RunCommand(cmd + args);
    if (r.exit_code != 0) {
      return absl::InternalError(
          absl::StrCat("etcdctl ", args, ": exit ", r.exit_code, ": ", r.output));
    }
    return absl::OkStatus();
  }
#endif

  std::string Log(int i) const { return ReadFile(LogPath(i)); }
  std::string Logs() const {
    std::string out;
    for (int i = 0; i < members_; ++i) {
      std::string log = Log(i);
      if (log.size() > 3000) log = "..." + log.substr(log.size() - 3000);
      absl::StrAppend(&out, "--- member ", i, " ---\n", log, "\n");
    }
    return out;
  }

 private:
  // Whether every thread of `pid` is in the stopped state ('T' in
  // /proc/PID/task/TID/stat); false when it cannot tell.
  static bool AllThreadsStopped(pid_t pid) {
    const std::string dir = absl::StrCat("/proc/", pid, "/task");
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return false;
    bool all = true, any = false;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char buf[512];
      const int fd = ::open(absl::StrCat(dir, "/", e->d_name, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;  // the thread ended
      const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
      ::close(fd);
      if (n <= 0) continue;
      buf[n] = '\0';
      const char* paren = ::strrchr(buf, ')');  // "TID (comm) STATE ..."
      if (paren == nullptr || paren[1] != ' ') return false;
      any = true;
      if (paren[2] != 'T' && paren[2] != 't') all = false;
    }
    ::closedir(d);
    return any && all;
  }

  struct Node {
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  std::string LogPath(int i) const { return dir_->File(absl::StrCat("m", i, ".log")); }
  std::string PeerUrl(int i) const { return "http://" + EtcdLoopback(nodes_[i].peer_port); }
  std::string ClientUrl(int i) const {
    return (tls_ca_.empty() ? "http://" : "https://") + EtcdLoopback(nodes_[i].client_port);
  }

  bool Running(int i) {
    Node& n = nodes_[i];
    if (n.pid <= 0) return false;
    if (WaitExit(n.pid, 0) != -1) {
      n.pid = -1;
      return false;
    }
    return true;
  }

  bool Spawn(int i, bool existing) {
    std::vector<std::string> initial;
    for (int j = 0; j < members_; ++j) initial.push_back(absl::StrCat("m", j, "=", PeerUrl(j)));
    std::vector<std::string> argv = {
        EtcdBinary(),
        "--name", absl::StrCat("m", i),
        "--data-dir", dir_->File(absl::StrCat("m", i, ".etcd")),
        "--listen-client-urls", ClientUrl(i),
        "--advertise-client-urls", ClientUrl(i),
        "--listen-peer-urls", PeerUrl(i),
        "--initial-advertise-peer-urls", PeerUrl(i),
        "--initial-cluster", absl::StrJoin(initial, ","),
        "--initial-cluster-state", existing ? "existing" : "new",
        "--initial-cluster-token", "hsdp-test",
        "--heartbeat-interval", "50",
        "--election-timeout", "500",
        "--logger", "zap",
        "--log-outputs", "stderr",
    };
    if (!tls_ca_.empty()) {
      for (const std::string& arg : {std::string("--cert-file"), tls_cert_,
                                     std::string("--key-file"), tls_key_,
                                     std::string("--trusted-ca-file"), tls_ca_,
                                     std::string("--client-cert-auth")}) {
        argv.push_back(arg);
      }
    }
    const pid_t pid = SpawnLogged(argv, LogPath(i));
    if (pid < 0) return false;
    nodes_[i].pid = pid;
    return true;
  }

  int members_;
  std::string tls_ca_, tls_cert_, tls_key_;  // PEM paths; "" = plaintext clients
  std::unique_ptr<TempDir> dir_;
  std::vector<Node> nodes_;
  std::string root_password_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_ETCD_TEST_CLUSTER_H_
