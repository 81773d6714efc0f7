// gRPC services on the daemon's Unix socket. Handlers authenticate the
// caller (an Authenticator), translate messages, and hand the work to the
// session manager; they never touch the data plane and never block:
// RegisterBuffer, the one call that waits (for its fd), is a callback method
// completed when the fd arrives or its deadline passes.
#ifndef HSDP_DAEMON_SERVER_GRPC_SERVICES_H_
#define HSDP_DAEMON_SERVER_GRPC_SERVICES_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_node.h"
#include "daemon/config/node_config.h"
#include "daemon/engine/engine.h"
#include "daemon/observability/observability.h"
#include "daemon/auth/authenticator.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/server/data_conn_server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "hsdp/v1/admin.grpc.pb.h"
#include "hsdp/v1/node.grpc.pb.h"

namespace hsdp {

// Counts RPC handlers currently running, so shutdown can wait for them and
// no longer.
class RpcTracker {
 public:
  class Scope {
   public:
    explicit Scope(RpcTracker* t) : t_(t) { t_->count_.fetch_add(1); }
    ~Scope() { t_->count_.fetch_sub(1); }

   private:
    RpcTracker* t_;
  };
  int in_flight() const { return count_.load(); }

 private:
  std::atomic<int> count_{0};
};

grpc::Status ToGrpc(const absl::Status& s);

class NodeServiceImpl final : public v1::Node::WithCallbackMethod_RegisterBuffer<v1::Node::Service> {
 public:
  // `data`: where groups' arenas are sent (may be null: no arenas handed out).
  NodeServiceImpl(SessionManager* sessions, const Authenticator* auth, const NodeConfig& config,
                  RpcTracker* tracker, DataConnServer* data = nullptr)
      : sessions_(sessions), auth_(auth), config_(config), tracker_(tracker), data_(data) {}
  grpc::Status Attach(grpc::ServerContext*, const v1::AttachRequest*, v1::AttachResponse*) override;
  grpc::Status Detach(grpc::ServerContext*, const v1::DetachRequest*, v1::DetachResponse*) override;
  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext*,
                                           const v1::RegisterBufferRequest*,
                                           v1::RegisterBufferResponse*) override;
  grpc::Status FreeBuffer(grpc::ServerContext*, const v1::FreeBufferRequest*,
                          v1::FreeBufferResponse*) override;
  grpc::Status NewGroup(grpc::ServerContext*, const v1::NewGroupRequest*,
                        v1::NewGroupResponse*) override;

 private:
  SessionManager* const sessions_;
  const Authenticator* const auth_;
  const NodeConfig& config_;
  RpcTracker* const tracker_;
  DataConnServer* const data_;
  std::atomic<uint64_t> next_arena_tag_{1};
};

class AdminServiceImpl final : public v1::Admin::Service {
 public:
  // `observability`: null disables Trace, Stragglers and Activity.
  // `drain`: starts a drain (Daemon::RequestDrain); null: Drain is UNIMPLEMENTED.
  // `config_yaml`: the current configuration (it changes on SIGHUP); null:
  // `config` as it was at start.
  using DrainFn = std::function<v1::DrainResponse(absl::Duration timeout)>;
  using ConfigYamlFn = std::function<std::string()>;
  AdminServiceImpl(SessionManager* sessions, const Authenticator* auth, const NodeConfig& config,
                   const Engine* engine, std::string socket_path,
                   Observability* observability = nullptr, ConfigYamlFn config_yaml = nullptr,
                   DrainFn drain = nullptr)
      : sessions_(sessions), auth_(auth), config_(config), engine_(engine),
        socket_path_(std::move(socket_path)), started_(absl::Now()),
        observability_(observability), config_yaml_(std::move(config_yaml)),
        drain_(std::move(drain)) {}
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusResponse*) override;
  // Root and the daemon's uid only; timeout_seconds in (0, 3600], 0: 60.
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*, v1::DrainResponse*) override;
  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest*,
                         v1::GetConfigResponse*) override;
  // Observability (daemon/observability/observability_rpc.h). Only root and
  // the daemon's uid see other users' jobs.
  grpc::Status Trace(grpc::ServerContext*, const v1::TraceRequest*, v1::TraceResponse*) override;
  grpc::Status Stragglers(grpc::ServerContext*, const v1::StragglersRequest*,
                          v1::StragglersResponse*) override;
  grpc::Status Activity(grpc::ServerContext*, const v1::ActivityRequest*,
                        v1::ActivityResponse*) override;

 private:
  SessionManager* const sessions_;
  const Authenticator* const auth_;
  const NodeConfig& config_;
  const Engine* const engine_;
  const std::string socket_path_;
  const absl::Time started_;
  Observability* const observability_;
  const ConfigYamlFn config_yaml_;
  const DrainFn drain_;
};

class HealthServiceImpl final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthServiceImpl(const Authenticator* auth) : auth_(auth) {}
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse*) override;
  void SetServing(bool serving) { serving_.store(serving); }

 private:
  const Authenticator* const auth_;
  std::atomic<bool> serving_{true};
};

// `hsdpctl nodes`: this daemon's view of the cluster (ClusterMember::View),
// or enabled=false on a single node. `cluster` may be null.
class AdminClusterServiceImpl final : public v1::AdminCluster::Service {
 public:
  AdminClusterServiceImpl(const Authenticator* auth, const ClusterNode* cluster)
      : auth_(auth), cluster_(cluster) {}
  grpc::Status Nodes(grpc::ServerContext*, const v1::NodesRequest*, v1::NodesResponse*) override;

 private:
  const Authenticator* const auth_;
  const ClusterNode* const cluster_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_GRPC_SERVICES_H_
