// Helpers for the cluster integration tests: loopback addresses, a token
// file, a daemon's cluster config, and `hsdpctl nodes --json` parsed.
#ifndef HSDP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_
#define HSDP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/ports.h"  // FreePort
#include "test_util.h"

namespace hsdp::testing {

inline std::string Loopback(int port) { return absl::StrCat("127.0.0.1:", port); }

inline std::string WriteToken(const TempDir& dir, const std::string& name,
                              const std::string& token) {
  const std::string path = dir.File(name);
  WriteFile(path, token + "\n");
  ::chmod(path.c_str(), 0600);
  return path;
}

// Fast heartbeats (200 ms, lost after 5 missed) so loss shows within ~1 s.
constexpr int kHeartbeatMs = 200;
constexpr int kMissed = 5;

}  // namespace hsdp::testing

// The store the cluster tests run on (cluster.store): the embedded
// coordinator, or, with HSDP_TEST_CLUSTER_STORE=etcd in the environment
// (ctest runs the cluster tests both ways: tests/integration/etcd.cmake), a
// real 3-member etcd cluster started once per test process.
#ifdef HSDP_ETCD_BIN
#include "etcd_test_cluster.h"
#endif

namespace hsdp::testing {

inline bool OnEtcd() {
  const char* store = std::getenv("HSDP_TEST_CLUSTER_STORE");
  return store != nullptr && std::string(store) == "etcd";
}

#ifdef HSDP_ETCD_BIN
// The etcd cluster of this test process (OnEtcd()): started on first use,
// stopped at exit. A start that fails aborts the process loudly.
inline EtcdTestCluster& SharedEtcd() {
  static EtcdTestCluster* cluster = [] {
    auto* c = new EtcdTestCluster(3);
    if (absl::Status s = c->Start(); !s.ok()) {
      std::fprintf(stderr, "cannot start the tests' etcd cluster: %s\n", s.ToString().c_str());
      std::abort();
    }
    std::atexit([] { delete cluster; });
    return c;
  }();
  return *cluster;
}
#endif

// What the cluster's store is called in errors and `hsdpctl nodes`: the
// coordinator's address, or "etcd (" + endpoints.
inline std::string StoreName(const std::string& coordinator) {
  return OnEtcd() ? std::string("etcd (") : coordinator;
}

// A daemon's cluster section. On etcd, `coordinator` (unique per test) names
// the cluster's key prefix and `token_file` is not used.
inline std::string ClusterYaml(const std::string& coordinator, const std::string& listen,
                               int nodes, const std::string& token_file,
                               int join_timeout_ms = 8000) {
#ifdef HSDP_ETCD_BIN
  if (OnEtcd()) {
    std::string endpoints;
    for (const std::string& e : SharedEtcd().endpoints()) {
      absl::StrAppend(&endpoints, endpoints.empty() ? "" : ", ", "\"", e, "\"");
    }
    std::string prefix = absl::StrCat("/hsdp-test/", ::getpid(), "/", coordinator, "/");
    return absl::StrCat("cluster:\n  store: etcd\n  etcd:\n    endpoints: [", endpoints,
                        "]\n    prefix: \"", prefix, "\"\n  insecure: true\n  listen: \"",
                        listen, "\"\n  nodes: ", nodes, "\n  heartbeat_ms: ", kHeartbeatMs,
                        "\n  missed_heartbeats: ", kMissed,
                        "\n  join_timeout_ms: ", join_timeout_ms, "\n");
  }
#endif
  return absl::StrCat("cluster:\n  coordinator: \"", coordinator, "\"\n  listen: \"", listen,
                      "\"\n  nodes: ", nodes, "\n  token_file: \"", token_file,
                      "\"\n  heartbeat_ms: ", kHeartbeatMs, "\n  missed_heartbeats: ", kMissed,
                      "\n  join_timeout_ms: ", join_timeout_ms, "\n");
}

// A CA (ca.pem, ca.key) and one certificate for 127.0.0.1 with both server
// and client use (node.pem, node.key) in `dir`, made with the openssl CLI.
// Returns openssl's output on failure, "" on success.
inline std::string MakeTestCertificates(const TempDir& dir) {
  const std::string d = dir.path();
  WriteFile(d + "/ext.cnf",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const CommandResult r = RunCommand(
      "cd '" + d + "' && openssl req -x509 " + ec +
      " -keyout ca.key -out ca.pem -days 2 -subj /CN=hsdp-test-ca && openssl req " + ec +
      " -keyout node.key -out node.csr -subj /CN=127.0.0.1 && openssl x509 -req -in node.csr"
      " -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 -extfile ext.cnf");
  return r.exit_code == 0 ? "" : "openssl failed: " + r.output;
}

// `hsdpctl nodes --json` (whatever its exit code: 1 means degraded).
inline bool QueryNodes(const std::string& socket, v1::NodesResponse* out) {
  CommandResult r = RunCommand(Hsdpctl(socket, "--timeout 2 --json nodes") + " 2>/dev/null");
  if (r.output.empty()) return false;
  out->Clear();
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  return google::protobuf::util::JsonStringToMessage(r.output, out, o).ok();
}

// True once the daemon on `socket` is "ok" and has had a successful
// heartbeat since `since_ms` (a NowMs() value): its contact with the
// coordinator (or etcd) is younger than the time passed since then.
inline bool HeartbeatSince(const std::string& socket, int64_t since_ms) {
  v1::NodesResponse view;
  return QueryNodes(socket, &view) && view.state() == "ok" &&
         view.coordinator_contact_age_s() >= 0 &&
         view.coordinator_contact_age_s() * 1000.0 < static_cast<double>(NowMs() - since_ms);
}

inline int AliveNodes(const v1::NodesResponse& r) {
  int n = 0;
  for (const auto& node : r.nodes()) n += node.state() == "alive";
  return n;
}

inline std::string StateOf(const v1::NodesResponse& r, int rank) {
  for (const auto& node : r.nodes()) {
    if (node.node_rank() == rank) return node.state();
  }
  return "";
}

// One daemon of a test cluster, in its own directory.
struct ClusterDaemon {
  TempDir dir;
  DaemonProcess process{dir};
  std::string socket() const { return dir.File("hsdpd.sock"); }
  std::string log() const { return ReadFile(dir.File("hsdpd.log")); }
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_
