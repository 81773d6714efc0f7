// Wires the daemon's components together and owns them: listener, gRPC
// server, data-connection server, session manager, dispatcher, engine, and
// in a cluster the ClusterNode (joined before the engine is built, since
// the cross-node engine rendezvous through the coordinator) and the
// placement directory. main() parses flags and config and hands the result
// here, with the factory of the cross-node engine.
#ifndef HSDP_DAEMON_SERVER_DAEMON_H_
#define HSDP_DAEMON_SERVER_DAEMON_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config/node_config.h"

namespace grpc {
class Server;
}

namespace hsdp {

class Authenticator;
class ClusterStore;
class ClusterDirectory;
class AdminClusterServiceImpl;
class ClusterNode;
class Engine;
class Executor;
class DataConnServer;
class Dispatcher;
class HealthServiceImpl;
class Listener;
class WakeFd;
class PeerRegistry;
class SessionManager;
class NodeServiceImpl;
class AdminServiceImpl;
class Observability;
class RpcTracker;
class DeviceBufferRegistry;
class DeviceRegistration;
class DeviceMemoryServiceImpl;
namespace device {
class DeviceApi;
}

// Wraps the node's engine into one that also reaches other nodes, with the
// coordinator's client for rendezvous and this daemon's instance in the
// cluster (daemon/server/cluster_engine.h).
using ClusterEngineFactory = std::function<absl::StatusOr<std::unique_ptr<Engine>>(
    std::unique_ptr<Engine> local, ClusterStore* coordinator, const NodeConfig& config,
    int threads, const std::string& instance)>;

class Daemon {
 public:
  // `config.socket_path` must be resolved (non-empty). `cluster_engine`:
  // used when cluster.coordinator is set (null: the local engine only, so
  // groups cannot span nodes).
  explicit Daemon(NodeConfig config, ClusterEngineFactory cluster_engine = nullptr);
  ~Daemon();

  // Binds the socket and starts every thread. FAILED_PRECONDITION when
  // another daemon owns the socket; CANCELLED after Cancel().
  absl::Status Start();
  // Makes a Start in progress (joining the cluster) return CANCELLED within
  // about a second. Thread-safe; call Shutdown after Start returned.
  void Cancel();
  // Tells every session, drains, stops threads, removes the socket.
  // Idempotent.
  void Shutdown();

  // hsdpctl drain (the Admin Drain RPC, any thread): records the request and
  // calls the notifier (main wakes its signal wait with it). The first
  // request wins; later ones report that a drain is under way.
  struct DrainState {
    bool already_draining = false;
    uint64_t sessions = 0;
    int64_t ops_in_flight = 0;
    absl::Duration timeout;
  };
  DrainState RequestDrain(absl::Duration timeout);
  void set_drain_notifier(std::function<void()> notify) { drain_notify_ = std::move(notify); }
  bool drain_requested() const { return drain_requested_.load(); }
  // Runs a requested drain (main's thread): health NOT_SERVING, attaches and
  // new operations refused, then waits until no operation is in flight or
  // the timeout passed. Shutdown afterwards tells the sessions why.
  void Drain();

  // SIGHUP: applies what a running daemon can take from `next` (the keys of
  // ReloadableKeys(): the log level; node.allowed_uids, ending the sessions
  // of uids no longer allowed) and names every other changed key as needing
  // a restart. Thread-safe against the RPCs (hsdpctl config shows the
  // reloaded values).
  struct ReloadReport {
    std::vector<std::string> applied, need_restart;
  };
  ReloadReport Reload(const NodeConfig& next);

  const NodeConfig& config() const { return config_; }

 private:
  std::atomic<bool> drain_requested_{false};
  // Guards the reloadable fields of config_ against GetConfig's rendering.
  mutable absl::Mutex config_mu_;
  absl::Mutex drain_mu_;
  absl::Duration drain_timeout_ ABSL_GUARDED_BY(drain_mu_);
  std::function<void()> drain_notify_;
  std::string end_reason_ = "hsdpd is shutting down";
  NodeConfig config_;
  const ClusterEngineFactory cluster_engine_;
  // First: groups (kept alive by the engine's callbacks) point at it.
  std::unique_ptr<Observability> observability_;
  std::unique_ptr<WakeFd> wake_;
  std::unique_ptr<Engine> engine_;
  // The GPU path (docs/gpu.md), when the engine runs device tasks: the
  // device API the registry maps with (shared with the engine), the
  // per-session device buffers, their registration and gRPC service.
  // Destroyed after the sessions ended (the registry unmaps at session end).
  std::shared_ptr<device::DeviceApi> device_api_;
  std::unique_ptr<DeviceBufferRegistry> device_registry_;
  std::unique_ptr<DeviceRegistration> device_registration_;
  std::unique_ptr<DeviceMemoryServiceImpl> device_service_;
  std::unique_ptr<Executor> control_;
  std::unique_ptr<PeerRegistry> peers_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<DataConnServer> data_server_;
  std::unique_ptr<RpcTracker> rpc_tracker_;
  std::unique_ptr<NodeServiceImpl> node_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<HealthServiceImpl> health_service_;
  std::unique_ptr<ClusterNode> cluster_;  // null on a single node
  std::unique_ptr<ClusterDirectory> directory_;  // placement; null on a single node
  // For the cluster's event callbacks (heartbeat thread), set once sessions_ exists.
  std::atomic<SessionManager*> sessions_ready_{nullptr};
  absl::Mutex cancel_mu_;
  bool cancelled_ ABSL_GUARDED_BY(cancel_mu_) = false;
  std::unique_ptr<AdminClusterServiceImpl> admin_cluster_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<Listener> listener_;
  bool started_ = false;
  bool shut_down_ = false;
};

// The node-wide buffer limit: config.max_node_bytes, or 90% of MemTotal.
uint64_t ResolveMaxNodeBytes(const NodeConfig& config);

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_DAEMON_H_
