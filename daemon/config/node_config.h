// The node configuration: what `hsdpd --node-config FILE` reads. Parsed and
// validated once in main(), then handed to components by const reference.
#ifndef HSDP_DAEMON_CONFIG_NODE_CONFIG_H_
#define HSDP_DAEMON_CONFIG_NODE_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config/priority_classes.h"

namespace hsdp {

struct NodeConfig {
  // node:
  std::string node_name;         // node.name; "" = the host name
  std::string socket_path;       // node.socket; "" = DaemonDefaultSocketPath()
  uint32_t socket_mode = 0660;   // node.socket_mode (octal in YAML, e.g. 0660)
  std::vector<uid_t> allowed_uids;  // node.allowed_uids; empty = {daemon uid, 0}

  // engine:
  std::string engine_kind = "cpu";  // engine.kind: "cpu", "nccl" or "auto"
  std::string engine_device = "cuda";  // engine.device: "cuda", or "fake" (tests only)
  int engine_threads = 0;           // engine.threads: 0 = all cores this process may use
  uint64_t inline_max_bytes = 64 * 1024;  // engine.inline_max_bytes: smaller ops skip the pool
  // Nice increment of the threads that run queued (large) work, 0..19: the
  // dispatcher thread, which matches every op and runs small ones inline,
  // then gets the CPU first when both want it (docs/qos.md).
  int engine_bulk_nice = 0;  // engine.bulk_nice
  bool engine_idle_lower_classes = true;  // engine.idle_lower_classes

  // limits:
  // Live connections (gRPC and data, counted from accept) one uid may hold
  // on the daemon's socket; root (uid 0) is exempt.
  uint32_t max_connections_per_uid = 64;     // limits.max_connections_per_uid: 1..65536
  uint64_t max_session_bytes = 64ull << 30;  // limits.max_session_bytes (sizes accept KiB/MiB/GiB)
  uint64_t max_node_bytes = 0;               // limits.max_node_bytes; 0 = 90% of MemTotal
  uint32_t max_sessions = 256;               // limits.max_sessions
  uint32_t max_buffers_per_session = 4096;   // limits.max_buffers_per_session
  uint32_t max_groups_per_job = 1024;        // limits.max_groups_per_job
  // Shared memory all of one job's sessions on this node may register
  // (incl. registrations in progress); 0 = only the session and node limits.
  uint64_t max_job_bytes = 0;                // limits.max_job_bytes
  // Operations all of one job's sessions on this node may have submitted and
  // not completed; 0 = only the rings bound them (per session).
  uint32_t max_job_ops_in_flight = 0;        // limits.max_job_ops_in_flight
  // The part of every node-wide pool one uid other than root may hold, in
  // percent: sessions, registered bytes, group members, arena memory and
  // NewGroup placement waits (NodeShare below). 100 = no per-uid share.
  uint32_t uid_share_percent = 50;           // limits.uid_share_percent: 1..100

  // jobs:
  // Classes of service between jobs (priority_classes.h): the first that
  // matches a job is its class; none = "default", level 4.
  std::vector<PriorityClass> priority_classes;  // jobs.priority_classes

  // data_plane:
  uint32_t ring_entries = 1024;  // data_plane.ring_entries: power of two, 16..65536
  uint32_t spin_us = 50;         // data_plane.spin_us: busy-poll before sleeping, 0..100000
  // data_plane.spin_mode: "yield" or "pause" (shm::SpinMode).
  std::string spin_mode = "yield";
  // Small operations of all-local groups run in a per-group arena among the
  // members, without the daemon (hsdp/shm/arena.h):
  // data_plane.small_op_bytes: the largest input per member that does, 0
  // (off) or 64..1048576, a multiple of 64;
  uint32_t small_op_bytes = 65536;
  // data_plane.small_op_slots: operations in flight per arena, a power of
  // two 1..64;
  uint32_t small_op_slots = 8;
  // data_plane.small_op_arena_mib: arena memory for the whole node, 0..1048576
  // MiB (a group created when it is used up runs everything through the daemon).
  uint32_t small_op_arena_mib = 256;

  // timeouts:
  uint32_t collective_timeout_ms = 60000;     // timeouts.collective_ms: 1..86400000
  uint32_t data_connect_timeout_ms = 10000;   // timeouts.data_connect_ms: 1..600000
  uint32_t shutdown_grace_ms = 5000;          // timeouts.shutdown_grace_ms: 0..600000
  // From accept: the whole time a new connection has to send its first 8
  // bytes and, for a data connection, its complete hello.
  uint32_t hello_timeout_ms = 5000;                 // timeouts.hello_ms: 1..600000
  // A gRPC connection with no RPC in flight for this long is closed (GOAWAY).
  uint32_t idle_connection_timeout_ms = 300000;     // timeouts.idle_connection_ms: 100..86400000

  // log:
  std::string log_level = "info";  // log.level: debug | info | warning | error

  // metrics:
  // "HOST:PORT" serving Prometheus /metrics over HTTP; "" = off. HOST is an
  // IPv4 address or a bracketed IPv6 one ("127.0.0.1" keeps it on the node);
  // port 0 picks a free port (logged, and shown by `hsdpctl status`).
  std::string metrics_listen;  // metrics.listen
  // Absolute path of the password HTTP basic auth checks on /metrics; "" =
  // no authentication, and then /metrics serves node totals only (no job
  // ids, owners or ranks: anyone who can reach the port may read it). Read
  // at start; the file must be owned by root or the daemon's uid and not
  // readable by group or others.
  std::string metrics_password_file;  // metrics.password_file
  std::string metrics_username = "hsdpd";  // metrics.username: 1..64 bytes, no ':', no spaces
  // Per-job metric series slots (256 on the node) one owner uid may hold;
  // its further jobs share its own overflow series (job_id "_other").
  uint32_t metrics_max_jobs_per_uid = 32;  // metrics.max_jobs_per_uid: 1..256

  // trace:
  uint32_t trace_buffer_events = 65536;  // trace.buffer_events: 0 (off) or 1024..4194304
  // cluster: (multi-node control plane; see docs/cluster.md)
  std::string cluster_coordinator;     // cluster.coordinator "HOST:PORT"; "" = single node
  std::string cluster_listen;          // cluster.listen "HOST:PORT": this daemon's peer address
  uint32_t cluster_nodes = 1;          // cluster.nodes: 1..16384
  int32_t cluster_node_rank = -1;      // cluster.node_rank: -1 = by join order
  std::string cluster_data_address;    // cluster.data_address HOST; "" = the listen host
  std::string cluster_token_file;      // cluster.token_file: absolute path of the shared secret
  std::string cluster_tls_ca;          // cluster.tls.ca: CA bundle (PEM) for mutual TLS; "" = no TLS
  std::string cluster_tls_cert;        // cluster.tls.cert: this node's certificate chain (PEM)
  std::string cluster_tls_key;         // cluster.tls.key: its private key (PEM)
  bool cluster_insecure = false;       // cluster.insecure: no peer authentication (warned)
  uint32_t cluster_join_timeout_ms = 60000;  // cluster.join_timeout_ms: 1..3600000
  uint32_t cluster_heartbeat_ms = 1000;      // cluster.heartbeat_ms: 10..60000
  uint32_t cluster_missed_heartbeats = 5;    // cluster.missed_heartbeats: 1..1000
  // cluster.store: where membership and the key/value store live.
  //   "embedded": the coordinator inside node 0's daemon (cluster.coordinator);
  //   "etcd": an etcd cluster (cluster.etcd), no coordinator.
  std::string cluster_store = "embedded";
  std::vector<std::string> cluster_etcd_endpoints;  // cluster.etcd.endpoints: HOST:PORT each
  std::string cluster_etcd_prefix = "/hsdp/";       // cluster.etcd.prefix: this cluster's keys
  std::string cluster_etcd_user;                    // cluster.etcd.user: "" = no etcd auth
  std::string cluster_etcd_password_file;           // cluster.etcd.password_file: absolute path
  std::string cluster_etcd_tls_ca;    // cluster.etcd.tls.ca: CA bundle (PEM); "" = plaintext
  std::string cluster_etcd_tls_cert;  // cluster.etcd.tls.cert: client certificate (optional)
  std::string cluster_etcd_tls_key;   // cluster.etcd.tls.key: its private key

  // Whether this daemon is one node of a cluster (either store).
  bool multi_node() const { return !cluster_coordinator.empty() || cluster_store == "etcd"; }

  // Field-by-field equality (used by tests and round-trip checks).
  friend bool operator==(const NodeConfig&, const NodeConfig&) = default;
};

// Parses and validates YAML text. `source` names the input in messages
// ("node.yaml", "<default>"). Errors are INVALID_ARGUMENT with a message
// "<source>:<line>: <key.path>: <what is wrong>" naming the key path, the bad
// value and the 1-based line, e.g.
//   node.yaml:7: limits.max_sessions: value "-3" is out of range [1, 65536]
//   node.yaml:3: enigne: unknown top-level key "enigne"; did you mean "engine"? (known: ...)
// Every key is optional; missing ones keep the defaults above. An empty
// document is valid. Unknown and duplicate keys are errors. Normalises
// log.level aliases ("warn" -> "warning").
absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view yaml_text, std::string_view source);

// Reads `path` ("/dev/stdin" and "-" work) and calls ParseNodeConfig with the
// path as the source ("<stdin>" for "-"). NOT_FOUND / PERMISSION_DENIED when
// the file cannot be opened, INVALID_ARGUMENT for any other read failure
// (a directory, a file over 1 MiB) and for invalid contents; every message
// names the path.
absl::StatusOr<NodeConfig> LoadNodeConfigFile(const std::string& path);

// The default configuration as a commented YAML document listing every key
// with its default value; parsing it gives NodeConfig{} exactly.
std::string DefaultNodeConfigYaml();

// Renders any config as commented YAML that ParseNodeConfig accepts and that
// parses back to an equal config (for any config ParseNodeConfig can return).
std::string NodeConfigToYaml(const NodeConfig& config);

// One line for logs and Status, e.g. "engine=cpu threads=auto ring_entries=1024
// spin_us=50 collective_timeout_ms=60000 max_sessions=256 max_session_bytes=64GiB
// max_node_bytes=auto log_level=info".
std::string NodeConfigSummary(const NodeConfig& config);

}  // namespace hsdp

#endif  // HSDP_DAEMON_CONFIG_NODE_CONFIG_H_
