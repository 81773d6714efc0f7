#include "daemon/cluster/cluster_node.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/cluster_member.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_member.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/kv_store.h"
#include "daemon/cluster/token_authenticator.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {

ClusterNode::ClusterNode(const NodeConfig& config, PeerEvents events, GroupEvents group_events)
    : config_(config), events_(std::move(events)), group_events_(std::move(group_events)) {}

void ClusterNode::Cancel() {
  absl::MutexLock l(&cancel_mu_);
  cancelled_ = true;
  if (member_) member_->Stop();
}

ClusterNode::~ClusterNode() { Stop(); }

absl::Status ClusterNode::Start() {
  return config_.cluster_store == "etcd" ? StartEtcd() : StartEmbedded();
}

absl::Status ClusterNode::StartMember(std::unique_ptr<Membership> member) {
  {
    absl::MutexLock l(&cancel_mu_);
    member_ = std::move(member);
    if (cancelled_) return absl::CancelledError("cluster: stopped while starting");
  }
  return member_->Start();
}

absl::Status ClusterNode::StartEtcd() {
  etcd::EtcdOptions options;
  options.endpoints = config_.cluster_etcd_endpoints;
  options.user = config_.cluster_etcd_user;
  if (!config_.cluster_etcd_password_file.empty()) {
    absl::StatusOr<std::string> password = ReadClusterToken(config_.cluster_etcd_password_file);
    if (!password.ok()) {
      return absl::Status(password.status().code(),
                          absl::StrCat("cluster.etcd.password_file: ", password.status().message()));
    }
    options.password = *password;
  }
  if (!config_.cluster_etcd_tls_ca.empty()) {
    ASSIGN_OR_RETURN(options.tls_ca, ReadPemFile("cluster.etcd.tls.ca", config_.cluster_etcd_tls_ca));
  }
  if (!config_.cluster_etcd_tls_cert.empty()) {
    ASSIGN_OR_RETURN(options.tls_cert,
                     ReadPemFile("cluster.etcd.tls.cert", config_.cluster_etcd_tls_cert));
    ASSIGN_OR_RETURN(options.tls_key,
                     ReadPemFile("cluster.etcd.tls.key", config_.cluster_etcd_tls_key));
  }
  if (options.user.empty() && options.tls_ca.empty()) {
    HSDP_LOG(Warning) << "cluster.insecure: the connection to etcd is NOT authenticated; anyone "
                         "who can reach etcd can join this cluster and read or write its keys";
  }
  // Connect authenticates: wrong credentials end the start here, clearly.
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Connect(
      std::move(options), absl::Milliseconds(std::min<uint32_t>(config_.cluster_join_timeout_ms, 10000)));
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("cluster.etcd: ", client.status().message()));
  }
  etcd_ = std::move(*client);
  auto store = std::make_unique<EtcdStore>(etcd_.get(), config_.cluster_etcd_prefix);
  EtcdStore* etcd_store = store.get();
  store_ = std::move(store);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  HSDP_LOG(Info) << "cluster: store etcd " << etcd_->name() << " under \""
                 << config_.cluster_etcd_prefix << "\" for " << config_.cluster_nodes << " nodes";
  return StartMember(std::make_unique<EtcdMember>(
      etcd_.get(), etcd_store,
      EtcdMember::Options{
          .prefix = config_.cluster_etcd_prefix,
          .address = config_.cluster_listen,
          .data_address = config_.cluster_data_address.empty()
                              ? config_.cluster_listen.substr(0, config_.cluster_listen.rfind(':'))
                              : config_.cluster_data_address,
          .name = config_.node_name.empty() ? host : config_.node_name,
          .nodes = config_.cluster_nodes,
          .node_rank = config_.cluster_node_rank,
          .join_timeout = absl::Milliseconds(config_.cluster_join_timeout_ms),
          .heartbeat = absl::Milliseconds(config_.cluster_heartbeat_ms),
          .missed_heartbeats = config_.cluster_missed_heartbeats},
      events_, group_events_));
}

absl::Status ClusterNode::StartEmbedded() {
  const bool is_coordinator = config_.cluster_listen == config_.cluster_coordinator;
  std::string token;
  if (!config_.cluster_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadClusterToken(config_.cluster_token_file));
  }
  std::shared_ptr<grpc::ServerCredentials> server_credentials = grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  if (!config_.cluster_tls_ca.empty()) {
    ASSIGN_OR_RETURN(const ClusterTlsFiles tls,
                     ReadClusterTls(config_.cluster_tls_ca, config_.cluster_tls_cert,
                                    config_.cluster_tls_key));
    grpc::SslServerCredentialsOptions server(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    server.pem_root_certs = tls.ca;
    server.pem_key_cert_pairs.push_back({tls.key, tls.cert});
    server_credentials = grpc::SslServerCredentials(server);
    channel_credentials = grpc::SslCredentials(grpc::SslCredentialsOptions{
        .pem_root_certs = tls.ca, .pem_private_key = tls.key, .pem_cert_chain = tls.cert});
    auth_ = std::make_unique<TlsPeerAuthenticator>(token);
  } else if (!token.empty()) {
    auth_ = std::make_unique<TokenAuthenticator>(token);
  } else {
    HSDP_LOG(Warning) << "cluster.insecure: the peer channel on " << config_.cluster_listen
                      << " is NOT authenticated; anyone who can reach it can join the cluster "
                         "and read or write its key/value store";
    auth_ = std::make_unique<InsecureClusterAuthenticator>();
  }
  if (is_coordinator) {
    coordinator_ = std::make_unique<Coordinator>(
        Coordinator::Options{.self_address = config_.cluster_listen,
                             .nodes = config_.cluster_nodes,
                             .heartbeat_ms = config_.cluster_heartbeat_ms,
                             .missed_heartbeats = config_.cluster_missed_heartbeats});
    kv_ = std::make_unique<KvStore>();
  }
  service_ = std::make_unique<ClusterServiceImpl>(auth_.get(), coordinator_.get(), kv_.get(),
                                                  config_.cluster_coordinator);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config_.cluster_listen, server_credentials, &port);
  // Two daemons must never share a port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 1100);
  builder.AddChannelArgument(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 2 << 20);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.listen: cannot listen on ", config_.cluster_listen,
        " (address in use, not an address of this host, or unusable cluster.tls files)"));
  }
  if (coordinator_ != nullptr) coordinator_->Start();
  HSDP_LOG(Info) << "cluster: " << (is_coordinator ? "coordinator" : "member")
                 << " listening on " << config_.cluster_listen << " for " << config_.cluster_nodes
                 << " nodes";

  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  store_ = std::make_unique<ClusterClient>(config_.cluster_coordinator, token,
                                           channel_credentials);
  const std::string listen_host =
      config_.cluster_listen.substr(0, config_.cluster_listen.rfind(':'));
  auto member = std::make_unique<ClusterMember>(
      ClusterMember::Options{
          .coordinator = config_.cluster_coordinator,
          .address = config_.cluster_listen,
          .data_address = config_.cluster_data_address.empty() ? listen_host
                                                               : config_.cluster_data_address,
          .name = config_.node_name.empty() ? host : config_.node_name,
          .nodes = config_.cluster_nodes,
          .node_rank = config_.cluster_node_rank,
          .token = token,
          .credentials = channel_credentials,
          .is_coordinator = is_coordinator,
          .join_timeout = absl::Milliseconds(config_.cluster_join_timeout_ms),
          .heartbeat = absl::Milliseconds(config_.cluster_heartbeat_ms),
          .missed_heartbeats = config_.cluster_missed_heartbeats},
      events_, group_events_);
  return StartMember(std::move(member));
}

size_t ClusterNode::kv_waiters() const { return kv_ ? kv_->waiter_count() : 0; }

void ClusterNode::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (member_) member_->Stop();
  if (coordinator_) coordinator_->Stop();
  // Pending Wait/Barrier reactors must finish before the server can stop.
  if (kv_) kv_->Shutdown();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

}  // namespace hsdp
