#include "daemon/cluster/cluster_client.h"

#include "absl/strings/str_cat.h"
#include "daemon/cluster/token_authenticator.h"
#include "grpcpp/grpcpp.h"

namespace hsdp {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

ClusterClient::ClusterClient(const std::string& coordinator, std::string token,
                             std::shared_ptr<grpc::ChannelCredentials> credentials)
    : coordinator_(coordinator), token_(std::move(token)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // Reconnect quickly: a coordinator that restarts is found again within a
  // second, not after gRPC's default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = v1::Cluster::NewStub(
      grpc::CreateCustomChannel(
          coordinator, credentials ? credentials : grpc::InsecureChannelCredentials(), args));
}

std::string ClusterClient::name() const {
  return absl::StrCat("the cluster coordinator ", coordinator_);
}

void ClusterClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token_.empty()) ctx->AddMetadata(kClusterTokenMetadata, token_);
}

absl::StatusOr<v1::JoinResponse> ClusterClient::Join(const v1::JoinRequest& req,
                                                     absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::JoinResponse resp;
  const grpc::Status s = stub_->Join(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("join ", coordinator_));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> ClusterClient::Heartbeat(const v1::HeartbeatRequest& req,
                                                               absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::HeartbeatResponse resp;
  const grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("heartbeat to ", coordinator_));
  return resp;
}

absl::StatusOr<v1::ListResponse> ClusterClient::List(absl::Duration timeout) const {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::ListResponse resp;
  const grpc::Status s = stub_->List(&ctx, v1::ListRequest(), &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("list the nodes of ", coordinator_));
  return resp;
}

absl::Status ClusterClient::Set(const std::string& key, const std::string& value,
                                absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::KvSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::KvSetResponse resp;
  return FromGrpc(stub_->Set(&ctx, req, &resp), absl::StrCat("set \"", key, "\""));
}

absl::StatusOr<std::string> ClusterClient::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::KvGetRequest req;
  req.set_key(key);
  v1::KvGetResponse resp;
  const grpc::Status s = stub_->Get(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("get \"", key, "\""));
  return std::move(*resp.mutable_value());
}

absl::StatusOr<int64_t> ClusterClient::Add(const std::string& key, int64_t delta,
                                           absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::KvAddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  v1::KvAddResponse resp;
  const grpc::Status s = stub_->Add(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("add \"", key, "\""));
  return resp.value();
}

absl::Status ClusterClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext ctx;
  // The RPC deadline leaves the server's own timeout room to answer first.
  Prepare(&ctx, timeout + absl::Seconds(2));
  v1::KvWaitRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout))));
  v1::KvWaitResponse resp;
  return FromGrpc(stub_->Wait(&ctx, req, &resp), "wait");
}

absl::StatusOr<std::vector<std::string>> ClusterClient::WaitValues(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(2));
  v1::KvWaitRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout))));
  req.set_return_values(true);
  v1::KvWaitResponse resp;
  const grpc::Status s = stub_->Wait(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "wait");
  if (resp.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("wait: the coordinator ", coordinator_, " answered ",
                                            resp.values_size(), " values for ", keys.size(),
                                            " keys"));
  }
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

absl::StatusOr<std::string> ClusterClient::SetIfAbsent(const std::string& key,
                                                       const std::string& value,
                                                       absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::KvSetRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_if_absent(true);
  v1::KvSetResponse resp;
  const grpc::Status s = stub_->Set(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("set \"", key, "\""));
  return std::move(*resp.mutable_value());
}

absl::Status ClusterClient::Delete(const std::vector<std::string>& keys, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::KvDeleteRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  v1::KvDeleteResponse resp;
  return FromGrpc(stub_->Delete(&ctx, req, &resp), "delete");
}

absl::Status ClusterClient::Report(const v1::ReportRequest& req, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::ReportResponse resp;
  return FromGrpc(stub_->Report(&ctx, req, &resp), absl::StrCat("report to ", coordinator_));
}

absl::Status ClusterClient::Barrier(const std::string& name, uint32_t count,
                                    absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(2));
  v1::BarrierRequest req;
  req.set_name(name);
  req.set_count(count);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout))));
  v1::BarrierResponse resp;
  return FromGrpc(stub_->Barrier(&ctx, req, &resp), absl::StrCat("barrier \"", name, "\""));
}

}  // namespace hsdp
