// Wires the daemon's components together and owns them: listener, gRPC
// server, data-connection server, session manager, dispatcher, engine.
// main() parses flags and config and hands the result here.
#ifndef HSDP_DAEMON_SERVER_DAEMON_H_
#define HSDP_DAEMON_SERVER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/config/node_config.h"

namespace grpc {
class Server;
}

namespace hsdp {

class Authenticator;
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

class Daemon {
 public:
  // `config.socket_path` must be resolved (non-empty).
  explicit Daemon(NodeConfig config);
  ~Daemon();

  // Binds the socket and starts every thread. FAILED_PRECONDITION when
  // another daemon owns the socket.
  absl::Status Start();
  // Tells every session, drains, stops threads, removes the socket.
  // Idempotent.
  void Shutdown();

  const NodeConfig& config() const { return config_; }

 private:
  NodeConfig config_;
  // First: groups (kept alive by the engine's callbacks) point at it.
  std::unique_ptr<Observability> observability_;
  std::unique_ptr<WakeFd> wake_;
  std::unique_ptr<Engine> engine_;
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
