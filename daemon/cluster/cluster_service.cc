#include "daemon/cluster/cluster_service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/kv_cluster_directory.h"
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

grpc::ServerUnaryReactor* ClusterServiceImpl::List(grpc::CallbackServerContext* ctx,
                                                   const v1::ListRequest*,
                                                   v1::ListResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  *resp = coordinator_->List();
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Set(grpc::CallbackServerContext* ctx,
                                                  const v1::KvSetRequest* req,
                                                  v1::KvSetResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  if (!req->if_absent()) return Finish(ctx, kv_->Set(req->key(), req->value()));
  absl::StatusOr<std::string> v = kv_->SetIfAbsent(req->key(), req->value());
  if (v.ok()) resp->set_value(std::move(*v));
  return Finish(ctx, v.status());
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Delete(grpc::CallbackServerContext* ctx,
                                                     const v1::KvDeleteRequest* req,
                                                     v1::KvDeleteResponse*) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  return Finish(ctx, kv_->Delete(std::vector<std::string>(req->keys().begin(), req->keys().end())));
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Report(grpc::CallbackServerContext* ctx,
                                                     const v1::ReportRequest* req,
                                                     v1::ReportResponse*) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  const absl::Status s = coordinator_->Report(*req);
  if (s.ok()) {
    // Remember one past each failed epoch, so a group created again later
    // (its node's trainers all restarted) starts in line with the others.
    for (const v1::GroupEvent& e : req->events()) {
      const std::string key = GroupEpochKey(e.group_key());
      uint32_t known = 0;
      if (absl::StatusOr<std::string> v = kv_->Get(key); v.ok()) (void)absl::SimpleAtoi(*v, &known);
      if (e.epoch() >= known &&  // Report checked 1 <= epoch < kMaxGroupEpoch
          kv_->Set(key, absl::StrCat(e.epoch() + 1)).ok()) {  // a full store only loses the hint
        // Bounded: the oldest hints go first, so they never fill the store.
        absl::MutexLock l(&epoch_keys_mu_);
        if (known == 0) epoch_keys_.push_back(key);
        while (epoch_keys_.size() > kMaxEpochHints) {
          (void)kv_->Delete({epoch_keys_.front()});
          epoch_keys_.pop_front();
        }
      }
    }
  }
  return Finish(ctx, s);
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
                                                   v1::KvWaitResponse* resp) {
  if (absl::Status s = Admit(ctx); !s.ok()) return Finish(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  const bool values = req->return_values();
  KvStore* kv = kv_;
  kv_->Wait(keys, DeadlineOf(ctx, req->timeout_ms()),
            [reactor, resp, values, kv, keys](absl::Status s) {
              size_t bytes = 0;
              for (size_t i = 0; s.ok() && values && i < keys.size(); ++i) {
                absl::StatusOr<std::string> v = kv->Get(keys[i]);  // deleted meanwhile: NOT_FOUND
                if (!v.ok()) {
                  s = v.status();
                } else if ((bytes += v->size()) > kMaxWaitValueBytes) {
                  s = absl::ResourceExhaustedError(absl::StrCat(
                      "the values of the ", keys.size(), " keys exceed ", kMaxWaitValueBytes,
                      " bytes; wait for fewer keys"));
                } else {
                  resp->add_values(std::move(*v));
                }
              }
              if (!s.ok()) resp->clear_values();
              reactor->Finish(ToGrpcStatus(s));
            });
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
