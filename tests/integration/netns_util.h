// Helpers for cluster tests whose nodes are network namespaces: the
// topology (namespaces, a bridge, veth pairs) made and removed by
// tools/scripts/netns_topology.py — the one definition the compose runner
// uses too — daemons started inside a node's namespace, children that
// enter one, and the link of a node taken down and up.
#ifndef HSDP_TESTS_INTEGRATION_NETNS_UTIL_H_
#define HSDP_TESTS_INTEGRATION_NETNS_UTIL_H_

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_test_util.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "test_util.h"

namespace hsdp::testing {

inline std::string TopologyScript() {
  return std::string(HSDP_SOURCE_DIR) + "/tools/scripts/netns_topology.py";
}

// Empty when network namespaces can be created here, else why not.
inline std::string NetnsUnavailable() {
  CommandResult r = RunCommand("/usr/bin/python3 '" + TopologyScript() + "' probe");
  return r.exit_code == 0 ? "" : r.output;
}

// The namespaces of one test, owned by this process (removed in the
// destructor; a test killed before that leaves them to the next `up`,
// which removes topologies whose owner is gone).
class NetnsTopology {
 public:
  NetnsTopology() = default;
  NetnsTopology(const NetnsTopology&) = delete;
  ~NetnsTopology() { Down(); }

  // One node per entry: its addresses (a /24). Returns false with the
  // script's output in `error`.
  bool Up(const std::vector<std::string>& node_addresses, std::string* error) {
    std::string cmd = "/usr/bin/python3 '" + TopologyScript() + "' up --owner " +
                      std::to_string(::getpid()) + " --prefix-len 24";
    for (const auto& a : node_addresses) cmd += " --node " + a;
    CommandResult r = RunCommand(cmd);
    up_ = true;
    google::protobuf::Struct topo;
    if (r.exit_code != 0 || !google::protobuf::util::JsonStringToMessage(r.output, &topo).ok()) {
      *error = r.output;
      return false;
    }
    switch_ = topo.fields().at("switch").string_value();
    for (const auto& n : topo.fields().at("nodes").list_value().values()) {
      namespaces_.push_back(n.struct_value().fields().at("namespace").string_value());
      ports_.push_back(n.struct_value().fields().at("switch_port").string_value());
    }
    return true;
  }

  void Down() {
    if (!up_) return;
    up_ = false;
    RunCommand("/usr/bin/python3 '" + TopologyScript() + "' down --owner " +
               std::to_string(::getpid()));
  }

  const std::string& Namespace(int node) const { return namespaces_[node]; }

  // Node `node`'s veth on the bridge's side: outside its namespace, as a
  // pulled cable or a failed switch port would be.
  bool SetLink(int node, bool up) {
    return RunCommand("ip -n '" + switch_ + "' link set '" + ports_[node] + "' " +
                      (up ? "up" : "down"))
               .exit_code == 0;
  }

  // Bytes the bridge received from node `node` (its veth's rx counter on
  // the switch side), -1 when unreadable.
  int64_t BytesFrom(int node) const {
    CommandResult r = RunCommand("ip netns exec '" + switch_ + "' cat /sys/class/net/" +
                                 ports_[node] + "/statistics/rx_bytes");
    return r.exit_code == 0 ? std::atoll(r.output.c_str()) : -1;
  }

 private:
  bool up_ = false;
  std::string switch_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> ports_;
};

// Moves the calling (single-threaded: a freshly forked child) process into
// namespace `ns`.
inline bool EnterNetns(const std::string& ns) {
  const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  return ok;
}

// An hsdpd inside a node's namespace (`ip netns exec` execs it in place,
// so the pid is the daemon's). Socket, config and log in its own TempDir.
class NetnsDaemon {
 public:
  NetnsDaemon() = default;
  NetnsDaemon(const NetnsDaemon&) = delete;
  ~NetnsDaemon() { Kill(); }

  bool Start(const std::string& ns, const std::string& yaml) {
    WriteFile(dir_.File("node.yaml"), yaml);
    pid_ = SpawnLogged({"/usr/sbin/ip", "netns", "exec", ns, BinDir() + "/hsdpd", "--socket",
                        socket(), "--log-level", "info", "--node-config", dir_.File("node.yaml")},
                       dir_.File("hsdpd.log"), Lifetime::kIndependent);
    return pid_ > 0;
  }
  bool WaitReady(int timeout_ms) {
    return Eventually(
               [&] {
                 if (pid_ <= 0 || WaitExit(pid_, 0) != -1) return true;  // exited: stop waiting
                 return Exists(socket()) && ConnectUnix(socket()).ok();
               },
               timeout_ms) &&
           pid_ > 0 && Exists(socket()) && ConnectUnix(socket()).ok();
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    WaitExit(pid_, 5000);
    pid_ = -1;
  }
  std::string socket() const { return dir_.File("hsdpd.sock"); }
  std::string log() const { return ReadFile(dir_.File("hsdpd.log")); }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
};

// `hsdpctl nodes --json`: this daemon's epoch (0 when unreadable).
inline uint64_t EpochOf(const std::string& socket) {
  v1::NodesResponse view;
  return QueryNodes(socket, &view) ? view.epoch() : 0;
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_NETNS_UTIL_H_
