#include "daemon/server/grpc_services.h"

#include <unistd.h>

#include <algorithm>

#include "daemon/observability/observability_rpc.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/version.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

#define AUTHENTICATE_OR_RETURN(cred)                                \
  absl::StatusOr<PeerCred> cred##_or = auth_->Authenticate(*ctx);   \
  if (!cred##_or.ok()) return ToGrpc(cred##_or.status());           \
  const PeerCred& cred = *cred##_or

grpc::Status NodeServiceImpl::Attach(grpc::ServerContext* ctx, const v1::AttachRequest* req,
                                     v1::AttachResponse* resp) {
  RpcTracker::Scope in_flight(tracker_);
  AUTHENTICATE_OR_RETURN(cred);
  AttachParams p;
  p.job_id = req->job_id();
  if (req->has_owner_uid()) p.owner_uid = req->owner_uid();
  p.caller_is_admin = auth_->IsAdmin(cred.uid);
  p.rank = req->rank();
  p.world_size = req->world_size();
  p.local_rank = req->local_rank();
  p.device = req->device();
  p.pid = req->pid();
  p.protocol_version = req->protocol_version();
  p.features = req->features();
  p.priority_class = req->priority_class();
  absl::StatusOr<AttachResult> r = sessions_->Attach(p, cred);
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_session_id(r->session_id);
  resp->set_session_token(std::string(r->token.begin(), r->token.end()));
  resp->set_ring_entries(r->ring_entries);
  resp->set_daemon_version(kHsdpVersion);
  resp->set_data_connect_timeout_ms(config_.data_connect_timeout_ms);
  resp->set_features(r->features);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::Detach(grpc::ServerContext* ctx, const v1::DetachRequest* req,
                                     v1::DetachResponse*) {
  RpcTracker::Scope in_flight(tracker_);
  AUTHENTICATE_OR_RETURN(cred);
  return ToGrpc(sessions_->Detach(req->session_id(), cred));
}

grpc::ServerUnaryReactor* NodeServiceImpl::RegisterBuffer(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterBufferRequest* req,
                                                         v1::RegisterBufferResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) {
    reactor->Finish(ToGrpc(cred.status()));
    return reactor;
  }
  // Counted until `done` runs, so shutdown waits for registrations in flight.
  auto scope = std::make_shared<RpcTracker::Scope>(tracker_);
  sessions_->RegisterBuffer(req->session_id(), req->fd_tag(), req->size_bytes(), req->name(),
                            *cred, [reactor, resp, scope](absl::StatusOr<uint64_t> id) {
                              if (id.ok()) resp->set_buffer_id(*id);
                              reactor->Finish(ToGrpc(id.status()));
                            });
  return reactor;
}

grpc::Status NodeServiceImpl::FreeBuffer(grpc::ServerContext* ctx, const v1::FreeBufferRequest* req,
                                         v1::FreeBufferResponse*) {
  RpcTracker::Scope in_flight(tracker_);
  AUTHENTICATE_OR_RETURN(cred);
  return ToGrpc(sessions_->FreeBuffer(req->session_id(), req->buffer_id(), cred));
}

grpc::Status NodeServiceImpl::NewGroup(grpc::ServerContext* ctx, const v1::NewGroupRequest* req,
                                       v1::NewGroupResponse* resp) {
  RpcTracker::Scope in_flight(tracker_);
  AUTHENTICATE_OR_RETURN(cred);
  std::vector<int> ranks(req->ranks().begin(), req->ranks().end());
  // A placement wait ends when the caller cancels its call (or disconnects).
  absl::StatusOr<NewGroupResult> r =
      sessions_->NewGroup(req->session_id(), ranks, cred, req->rejoin_group_id(),
                          [ctx] { return ctx->IsCancelled(); });
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_group_id(r->group_id);
  resp->set_group_rank(r->group_rank);
  resp->set_group_size(r->group_size);
  resp->set_epoch(r->epoch);
  if (r->arena != nullptr && data_ != nullptr) {
    const uint64_t tag = next_arena_tag_.fetch_add(1);
    if (absl::Status s = data_->SendArena(req->session_id(), tag, r->arena->fd()); !s.ok()) {
      return ToGrpc(s);
    }
    resp->set_arena_fd_tag(tag);
    resp->set_arena_bytes(r->arena->bytes());
    resp->set_arena_timeout_ms(config_.collective_timeout_ms);
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Status(grpc::ServerContext* ctx, const v1::StatusRequest*,
                                      v1::StatusResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  // Everyone allowed sees the node's totals; only root and the daemon's uid
  // see other users' jobs and sessions.
  const bool admin = auth_->IsAdmin(cred.uid);
  resp->set_version(kHsdpVersion);
  resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  resp->set_node_name(config_.node_name.empty() ? host : config_.node_name);
  resp->set_socket_path(socket_path_);
  resp->set_engine(engine_->name());
  resp->set_engine_threads(engine_->threads());
  resp->set_config_summary(NodeConfigSummary(config_));
  uint64_t done = sessions_->retired_ops_completed();
  uint64_t failed = sessions_->retired_ops_failed();
  for (const std::shared_ptr<Session>& s : sessions_->Snapshot()) {
    done += s->ops_completed();
    failed += s->ops_failed();
    // Visible to its own uid and to its job's owner (root may have joined).
    if (!admin && s->info().uid != cred.uid && s->info().owner_uid != cred.uid) continue;
    v1::SessionInfo* si = resp->add_sessions();
    si->set_session_id(s->id());
    si->set_job_id(s->info().job_id);
    si->set_rank(s->info().rank);
    si->set_world_size(s->info().world_size);
    si->set_local_rank(s->info().local_rank);
    si->set_device(s->info().device);
    si->set_pid(s->info().pid);
    si->set_peer_pid(s->peer_pid());
    si->set_peer_uid(s->info().uid);
    si->set_age_seconds(s->AgeSeconds());
    si->set_buffers(s->buffer_count());
    si->set_buffer_bytes(s->buffer_bytes());
    si->set_ops_completed(s->ops_completed());
    si->set_ops_failed(s->ops_failed());
    si->set_data_connected(s->data_connected());
    si->set_owner_uid(s->info().owner_uid);
  }
  for (const JobSummary& j :
       sessions_->Jobs(admin ? std::nullopt : std::optional<uint32_t>(cred.uid))) {
    v1::JobInfo* ji = resp->add_jobs();
    ji->set_job_id(j.job_id);
    ji->set_world_size(j.world_size);
    ji->set_attached_ranks(j.attached);
    ji->set_groups(j.groups);
    ji->set_owner_uid(j.owner_uid);
    ji->set_priority_class(j.priority_class);
    ji->set_priority_level(j.priority_level);
  }
  resp->set_ops_completed(done);
  resp->set_ops_failed(failed);
  resp->set_bytes_registered(sessions_->bytes_registered());
  resp->set_retired_groups(sessions_->retired_groups());
  if (observability_ != nullptr) resp->set_metrics_address(observability_->metrics_address());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Trace(grpc::ServerContext* ctx, const v1::TraceRequest* req,
                                     v1::TraceResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  if (observability_ == nullptr) return ToGrpc(absl::UnimplementedError("no observability"));
  const bool admin = auth_->IsAdmin(cred.uid);
  return ToGrpc(HandleTrace(*observability_, *req,
                            admin ? std::nullopt : std::optional<uint32_t>(cred.uid), resp));
}

grpc::Status AdminServiceImpl::Stragglers(grpc::ServerContext* ctx,
                                          const v1::StragglersRequest* req,
                                          v1::StragglersResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  if (observability_ == nullptr) return ToGrpc(absl::UnimplementedError("no observability"));
  const bool admin = auth_->IsAdmin(cred.uid);
  HandleStragglers(*observability_, *req, admin ? std::nullopt : std::optional<uint32_t>(cred.uid),
                   resp);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Activity(grpc::ServerContext* ctx, const v1::ActivityRequest*,
                                        v1::ActivityResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  if (observability_ == nullptr) return ToGrpc(absl::UnimplementedError("no observability"));
  const bool admin = auth_->IsAdmin(cred.uid);
  resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  HandleActivity(*observability_, *sessions_,
                 admin ? std::nullopt : std::optional<uint32_t>(cred.uid), resp);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                                     v1::DrainResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  if (!auth_->IsAdmin(cred.uid)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "only root or hsdpd's own uid may drain it");
  }
  if (drain_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no drain here");
  const double t = req->timeout_seconds();
  if (!(t >= 0 && t <= 3600)) {  // NaN fails too
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "timeout_seconds: must be within [0, 3600] (0: 60)");
  }
  // A positive timeout below a nanosecond (1e-300 s) would round to zero
  // (found by the gRPC fuzzer): at least 1 ms.
  *resp = drain_(t == 0 ? absl::Seconds(60) : std::max(absl::Seconds(t), absl::Milliseconds(1)));
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::GetConfig(grpc::ServerContext* ctx, const v1::GetConfigRequest*,
                                         v1::GetConfigResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  (void)cred;
  resp->set_yaml(config_yaml_ ? config_yaml_() : NodeConfigToYaml(config_));
  return grpc::Status::OK;
}

grpc::Status HealthServiceImpl::Check(grpc::ServerContext* ctx,
                                      const grpc::health::v1::HealthCheckRequest* req,
                                      grpc::health::v1::HealthCheckResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  (void)cred;
  if (!req->service().empty() && req->service() != "hsdp.v1.Node" &&
      req->service() != "hsdp.v1.Admin") {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + req->service());
  }
  resp->set_status(serving_.load() ? grpc::health::v1::HealthCheckResponse::SERVING
                                   : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status AdminClusterServiceImpl::Nodes(grpc::ServerContext* ctx, const v1::NodesRequest*,
                                            v1::NodesResponse* resp) {
  AUTHENTICATE_OR_RETURN(cred);
  (void)cred;
  if (cluster_ == nullptr || cluster_->member() == nullptr) {
    resp->set_enabled(false);
    resp->set_state("single-node");
    resp->set_node_rank(0);
    return grpc::Status::OK;
  }
  *resp = cluster_->member()->ClusterView();
  resp->set_kv_waiters(static_cast<uint32_t>(cluster_->kv_waiters()));
  return grpc::Status::OK;
}

}  // namespace hsdp
