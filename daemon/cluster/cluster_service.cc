#include "daemon/cluster/cluster_service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace

absl::Status ClusterServiceImpl::Admit(grpc::CallbackServerContext* ctx) const {
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) {
    HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: refused a call from " << ctx->peer() << ": "
                                     << cred.status().message();
    return cred.status();
  }
  if (coordinator_ == nullptr || kv_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this hsdpd is not the cluster coordinator; the coordinator is ", coordinator_address_));
  }
  return absl::OkStatus();
}

absl::Time ClusterServiceImpl::DeadlineOf(grpc::CallbackServerContext* ctx, uint32_t timeout_ms) {
  const absl::Time own = absl::Now() + absl::Milliseconds(timeout_ms);
  const auto call = ctx->deadline();
  if (call >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) return own;
  return std::min(absl::FromChrono(call), own);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Join(grpc::CallbackServerContext* ctx,
                                                   const v1::JoinRequest* req,
                                                   v1::JoinResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<v1::JoinResponse> r = coordinator_->Join(*req);
  if (r.ok()) *resp = std::move(*r);
  return Finish(ctx, r.status());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const v1::HeartbeatRequest* req,
                                                        v1::HeartbeatResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<v1::HeartbeatResponse> r = coordinator_->Heartbeat(*req);
  if (r.ok()) *resp = std::move(*r);
  return Finish(ctx, r.status());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Set(grpc::CallbackServerContext* ctx,
                                                  const v1::KvSetRequest* req,
                                                  v1::KvSetResponse*) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  return Finish(ctx, kv_->Set(req->key(), req->value()));
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Get(grpc::CallbackServerContext* ctx,
                                                  const v1::KvGetRequest* req,
                                                  v1::KvGetResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<std::string> v = kv_->Get(req->key());
  if (v.ok()) resp->set_value(std::move(*v));
  return Finish(ctx, v.status());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Add(grpc::CallbackServerContext* ctx,
                                                  const v1::KvAddRequest* req,
                                                  v1::KvAddResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  absl::StatusOr<int64_t> v = kv_->Add(req->key(), req->delta());
  if (v.ok()) resp->set_value(*v);
  return Finish(ctx, v.status());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Wait(grpc::CallbackServerContext* ctx,
                                                   const v1::KvWaitRequest* req,
                                                   v1::KvWaitResponse*) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  kv_->Wait(keys, DeadlineOf(ctx, req->timeout_ms()),
            [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Barrier(grpc::CallbackServerContext* ctx,
                                                      const v1::BarrierRequest* req,
                                                      v1::BarrierResponse*) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  kv_->Barrier(req->name(), req->count(), DeadlineOf(ctx, req->timeout_ms()),
               [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

}  // namespace hsdp
