#include "daemon/server/daemon.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/sysinfo.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/cluster_node.h"
#include "daemon/config/config_diff.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "daemon/cluster/nccl_id_exchange.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/dataplane/group.h"
#include "daemon/jobs/device_registration.h"
#include "daemon/server/device_service.h"
#include "daemon/session/device_buffers.h"
#include "daemon/engine/engine_factory.h"
#include "daemon/observability/observability.h"
#include "daemon/observability/observability_rpc.h"
#include "daemon/auth/authenticator.h"
#include "daemon/util/executor.h"
#include "daemon/server/data_conn_server.h"
#include "daemon/server/grpc_services.h"
#include "daemon/server/listener.h"
#include "daemon/auth/peer_registry.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/server_posix.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

constexpr int kMaxGrpcThreads = 32;

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

uint64_t ResolveMaxNodeBytes(const NodeConfig& config) {
  if (config.max_node_bytes != 0) return config.max_node_bytes;
  struct sysinfo si;
  if (sysinfo(&si) != 0) return uint64_t{1} << 40;
  return static_cast<uint64_t>(si.totalram) * si.mem_unit / 10 * 9;
}

Daemon::Daemon(NodeConfig config, ClusterEngineFactory cluster_engine)
    : config_(std::move(config)), cluster_engine_(std::move(cluster_engine)) {}

Daemon::~Daemon() {
  Shutdown();
  // Before the directory and the cluster node they point at.
  dispatcher_.reset();
  data_server_.reset();
  sessions_.reset();
  directory_.reset();
}

void Daemon::Cancel() {
  absl::MutexLock l(&cancel_mu_);
  cancelled_ = true;
  if (cluster_) cluster_->Cancel();
}

static_assert(PeerEvent::kUnheardNodes == Group::kEveryRemoteNode,
              "a member's loss of the nodes it never heard of reaches every group");

absl::Status Daemon::Start() {
  std::vector<uint32_t> uids(config_.allowed_uids.begin(), config_.allowed_uids.end());
  peers_ = std::make_unique<PeerRegistry>(uids);
  ASSIGN_OR_RETURN(listener_, Listener::Bind(config_.socket_path, config_.socket_mode));
  auth_ = std::make_unique<UnixPeerAuthenticator>(peers_.get());
  ASSIGN_OR_RETURN(wake_, WakeFd::Create());
  if (config_.multi_node()) {
    // Joined first: the cross-node engine rendezvous through the coordinator.
    // Events reach the session manager once it exists (none can concern a
    // group before).
    auto cluster = std::make_unique<ClusterNode>(
        config_,
        [this](const PeerEvent& e) {
          SessionManager* sm = sessions_ready_.load();
          if (sm == nullptr) return;
          if (e.kind == PeerEvent::Kind::kLost) {
            sm->OnPeerLost(e.node, e.why, e.old_instance);
          } else {
            sm->OnPeerJoined(e.node);
          }
        },
        [this](const v1::GroupEvent& e) {
          if (SessionManager* sm = sessions_ready_.load(); sm != nullptr) {
            sm->OnGroupEvent(e.group_key(), e.epoch(), e.origin_node(), e.why(),
                             e.completed_seq());
          }
        });
    {
      absl::MutexLock l(&cancel_mu_);
      if (cancelled_) return absl::CancelledError("stopped while starting");
      cluster_ = std::move(cluster);
    }
    // Blocks up to cluster.join_timeout_ms (Cancel ends it sooner).
    RETURN_IF_ERROR(cluster_->Start());
  }
  const int threads = config_.engine_threads > 0 ? config_.engine_threads : UsableCores();
  EngineOptions engine_options;
  engine_options.kind = config_.engine_kind;
  engine_options.threads = threads;
  engine_options.inline_max_bytes = config_.inline_max_bytes;
  engine_options.bulk_nice = config_.engine_bulk_nice;
  engine_options.idle_lower_classes = config_.engine_idle_lower_classes;
  engine_options.device = config_.engine_device;
  if (cluster_) {
    // Device groups that span nodes: NCCL unique ids through the coordinator.
    engine_options.nccl.exchange_id = MakeNcclIdExchange(cluster_->client());
  }
  ASSIGN_OR_RETURN(DeviceStack stack, MakeEngine(engine_options));
  engine_ = std::move(stack.engine);
  device_api_ = std::move(stack.device);
  if (cluster_) {
    if (cluster_engine_) {
      ASSIGN_OR_RETURN(engine_, cluster_engine_(std::move(engine_), cluster_->client(), config_,
                                                threads, cluster_->member()->instance()));
    } else {
      HSDP_LOG(Warning) << "cluster: this hsdpd has no cross-node engine; groups cannot span "
                           "nodes";
    }
    directory_ = std::make_unique<KvClusterDirectory>(cluster_->client(), cluster_->member(),
                                                      static_cast<int>(config_.cluster_nodes));
  }
  control_ = std::make_unique<Executor>(2);
  NodeLimits limits;
  limits.max_node_bytes = ResolveMaxNodeBytes(config_);
  limits.max_mappings = MappingBudget(KernelMaxMapCount());
  ObservabilityOptions observability_options{config_.metrics_listen,
                                              config_.trace_buffer_events};
  observability_options.metrics_password_file = config_.metrics_password_file;
  observability_options.metrics_username = config_.metrics_username;
  observability_options.metrics_max_jobs_per_uid = config_.metrics_max_jobs_per_uid;
  ASSIGN_OR_RETURN(observability_,
                   Observability::Create(observability_options,
                                         [this] { return CollectNodeGauges(*sessions_); }));
  sessions_ = std::make_unique<SessionManager>(config_, limits, engine_.get(), control_.get(),
                                               observability_.get(), directory_.get());
  if (device_api_ != nullptr) {
    // Device memory is offered only when a device engine runs: a session
    // negotiates kFeatureDeviceMemory at Attach, then registers device
    // buffers through the DeviceMemory service.
    device_registry_ = std::make_unique<DeviceBufferRegistry>(device_api_.get());
    device_registration_ =
        std::make_unique<DeviceRegistration>(sessions_.get(), device_registry_.get());
    sessions_->EnableFeatures(shm::kFeatureDeviceMemory);
    HSDP_LOG(Info) << "device memory: " << device_api_->DeviceCount() << " device(s) on "
                   << device_api_->name() << "; engine " << engine_->name();
  }
  sessions_ready_.store(sessions_.get());
  RETURN_IF_ERROR(observability_->ServeMetrics());
  if (!config_.metrics_listen.empty()) {
    HSDP_LOG(Info) << "metrics: serving Prometheus /metrics on http://"
                   << observability_->metrics_address() << "/metrics";
  }
  dispatcher_ = std::make_unique<Dispatcher>(sessions_.get(), wake_.get(),
                                             int64_t{config_.spin_us} * 1000,
                                             device_registry_.get(),
                                             ParseSpinMode(config_.spin_mode));
  data_server_ = std::make_unique<DataConnServer>(
      sessions_.get(), wake_.get(), [this](uint32_t uid) { return peers_->Allowed(uid); });
  RETURN_IF_ERROR(data_server_->Start());

  rpc_tracker_ = std::make_unique<RpcTracker>();
  node_service_ = std::make_unique<NodeServiceImpl>(sessions_.get(), auth_.get(), config_,
                                                    rpc_tracker_.get(), data_server_.get());
  admin_service_ = std::make_unique<AdminServiceImpl>(
      sessions_.get(), auth_.get(), config_, engine_.get(), config_.socket_path,
      observability_.get(),
      [this] {
        absl::MutexLock l(&config_mu_);
        return NodeConfigToYaml(config_);
      },
      [this](absl::Duration timeout) {
        const DrainState st = RequestDrain(timeout);
        v1::DrainResponse r;
        r.set_already_draining(st.already_draining);
        r.set_sessions(st.sessions);
        r.set_ops_in_flight(static_cast<uint64_t>(std::max<int64_t>(0, st.ops_in_flight)));
        r.set_timeout_seconds(absl::ToDoubleSeconds(st.timeout));
        return r;
      });
  health_service_ = std::make_unique<HealthServiceImpl>(auth_.get());
  admin_cluster_service_ = std::make_unique<AdminClusterServiceImpl>(auth_.get(), cluster_.get());
  if (device_registration_ != nullptr) {
    device_service_ = std::make_unique<DeviceMemoryServiceImpl>(
        device_registration_.get(), auth_.get(), rpc_tracker_.get());
  }
  grpc::ServerBuilder builder;
  // Connections come from AddInsecureChannelFromFd, where gRPC's handshake
  // timeout does not apply; measured: MAX_CONNECTION_IDLE closes one that
  // sent the HTTP/2 preface (or nothing) and then went silent, keepalive
  // closes one with an RPC open that stops answering pings.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(config_.idle_connection_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 100);
  // Handlers never wait (RegisterBuffer is a callback method), so a small,
  // fixed number of threads serves every connection; a burst of calls queues
  // instead of growing one thread per call.
  grpc::ResourceQuota quota("hsdpd");
  quota.SetMaxThreads(kMaxGrpcThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(node_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(health_service_.get());
  builder.RegisterService(admin_cluster_service_.get());
  if (device_service_ != nullptr) builder.RegisterService(device_service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr) return absl::InternalError("cannot start the gRPC server");

  dispatcher_->Start();
  listener_->Start(
      Listener::Options{.max_connections_per_uid = config_.max_connections_per_uid,
                        .hello_timeout_ms = config_.hello_timeout_ms},
      peers_.get(),
      [this](Listener::Accepted c) {
        // The registry keeps the uid's connection slot until gRPC closes the fd.
        peers_->Add(c.fd.get(), c.cred, std::move(c.slot));
        grpc::AddInsecureChannelFromFd(grpc_server_.get(), c.fd.Release());
      },
      [this](Listener::Accepted c) { data_server_->Adopt(std::move(c)); });
  started_ = true;
  HSDP_LOG(Info) << "hsdpd listening on " << config_.socket_path << " (" << NodeConfigSummary(config_)
                 << ", engine threads " << threads << ")";
  return absl::OkStatus();
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (health_service_) health_service_->SetServing(false);
  if (listener_) listener_->Stop();  // no new connections; socket removed
  if (sessions_) sessions_->EndAll(end_reason_);
  // After the sessions: their groups' failures still reach the other nodes,
  // and their ranks are withdrawn while the coordinator answers.
  if (cluster_) cluster_->Stop();
  if (dispatcher_) dispatcher_->Stop();
  if (engine_) engine_->Shutdown();
  // The members of ended groups finish what they were reading in their
  // arenas (a drained trainer carries on with the next daemon in step).
  if (sessions_) sessions_->ReleaseArenas(absl::Seconds(1));
  if (control_) control_->Shutdown();
  if (grpc_server_) {
    // Let running Node RPCs finish (up to the grace period), then cancel
    // whatever is left; idle connections do not hold shutdown up.
    const absl::Time grace_end = absl::Now() + absl::Milliseconds(config_.shutdown_grace_ms);
    while (rpc_tracker_->in_flight() > 0 && absl::Now() < grace_end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    grpc_server_->Shutdown(std::chrono::system_clock::now());
  }
  if (data_server_) data_server_->Stop();
  if (observability_) observability_->StopMetrics();
  if (started_) HSDP_LOG(Info) << "hsdpd stopped";
}

Daemon::DrainState Daemon::RequestDrain(absl::Duration timeout) {
  DrainState st;
  st.already_draining = drain_requested_.exchange(true);
  {
    absl::MutexLock l(&drain_mu_);
    if (!st.already_draining) drain_timeout_ = timeout;
    st.timeout = drain_timeout_;
  }
  if (SessionManager* s = sessions_ready_.load()) {
    st.sessions = s->Snapshot().size();
    st.ops_in_flight = s->OpsInFlight();
  }
  if (!st.already_draining) {
    HSDP_LOG(Info) << "drain requested: " << st.sessions << " sessions, " << st.ops_in_flight
                   << " operations in flight, timeout " << timeout;
    if (drain_notify_) drain_notify_();
  }
  return st;
}

void Daemon::Drain() {
  if (!started_ || sessions_ == nullptr) return;
  absl::Duration timeout;
  {
    absl::MutexLock l(&drain_mu_);
    timeout = drain_timeout_;
  }
  sessions_->BeginDrain();
  dispatcher_->BeginDrain();
  if (health_service_) health_service_->SetServing(false);  // after: NOT_SERVING means refusing
  const absl::Time deadline = absl::Now() + timeout;
  int64_t left = sessions_->OpsInFlight();
  while (left > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    left = sessions_->OpsInFlight();
  }
  if (left == 0) {
    HSDP_LOG(Info) << "drained: no operation in flight; stopping for a restart";
    end_reason_ = "hsdpd drained for a restart (hsdpctl drain): reconnect once it is back";
  } else {
    HSDP_LOG(Warning) << "drain timed out after " << timeout << " with " << left
                      << " operations in flight; they fail now";
    end_reason_ = absl::StrCat("hsdpd drained for a restart (hsdpctl drain); ", left,
                               " operations still in flight after ", absl::FormatDuration(timeout),
                               " failed");
  }
}

Daemon::ReloadReport Daemon::Reload(const NodeConfig& next) {
  ReloadReport r;
  absl::MutexLock l(&config_mu_);
  for (const std::string& key : ChangedKeys(config_, next)) {
    if (key == "log.level") {
      LogLevel level;
      if (!ParseLogLevel(next.log_level, &level)) continue;  // the parser checked it
      SetLogLevel(level);
      config_.log_level = next.log_level;
      r.applied.push_back(key);
    } else if (key == "node.allowed_uids" && peers_ != nullptr) {
      peers_->SetAllowed(next.allowed_uids);
      config_.allowed_uids = next.allowed_uids;
      r.applied.push_back(key);
      // A uid no longer allowed: its new calls and connections are refused
      // (the peer registry); its sessions end now.
      if (sessions_ != nullptr) {
        for (const std::shared_ptr<Session>& s : sessions_->Snapshot()) {
          if (!peers_->Allowed(s->info().uid)) {
            sessions_->EndSession(s->id(), "its uid was removed from node.allowed_uids");
          }
        }
      }
    } else {
      r.need_restart.push_back(key);
    }
  }
  return r;
}

}  // namespace hsdp
