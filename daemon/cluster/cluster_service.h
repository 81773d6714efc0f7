// The Cluster gRPC service on cluster.listen (TCP). Every method is a
// callback (reactor) method, so a Wait or Barrier pending for minutes holds
// no gRPC thread: the reactor is finished by the KvStore when the wait ends.
// Every call is authenticated first (TokenAuthenticator, TlsPeerAuthenticator
// or, with cluster.insecure, InsecureClusterAuthenticator). On a daemon that is not
// the coordinator `coordinator` and `kv` are null and every call is
// FAILED_PRECONDITION naming the coordinator.
#ifndef HSDP_DAEMON_CLUSTER_CLUSTER_SERVICE_H_
#define HSDP_DAEMON_CLUSTER_CLUSTER_SERVICE_H_

#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/kv_store.h"
#include "daemon/auth/authenticator.h"
#include "hsdp/v1/cluster.grpc.pb.h"

namespace hsdp {

class ClusterServiceImpl final : public v1::Cluster::CallbackService {
 public:
  ClusterServiceImpl(const Authenticator* auth, Coordinator* coordinator, KvStore* kv,
                     std::string coordinator_address)
      : auth_(auth), coordinator_(coordinator), kv_(kv),
        coordinator_address_(std::move(coordinator_address)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext*, const v1::JoinRequest*,
                                 v1::JoinResponse*) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse*) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext*, const v1::ListRequest*,
                                 v1::ListResponse*) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext*, const v1::KvSetRequest*,
                                v1::KvSetResponse*) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext*, const v1::KvGetRequest*,
                                v1::KvGetResponse*) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext*, const v1::KvWaitRequest*,
                                 v1::KvWaitResponse*) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext*, const v1::KvAddRequest*,
                                v1::KvAddResponse*) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext*, const v1::BarrierRequest*,
                                    v1::BarrierResponse*) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext*, const v1::KvDeleteRequest*,
                                   v1::KvDeleteResponse*) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext*, const v1::ReportRequest*,
                                   v1::ReportResponse*) override;

  // Values a Wait with return_values may carry in all.
  static constexpr size_t kMaxWaitValueBytes = 4 << 20;
  // Group epoch hints (hsdp/epoch/<key>) kept in the store; older ones are deleted.
  static constexpr size_t kMaxEpochHints = 4096;

 private:
  // OK when the caller may proceed; else the status to finish with.
  absl::Status Admit(grpc::CallbackServerContext* ctx) const;
  // The earlier of the call's deadline and now + timeout_ms.
  static absl::Time DeadlineOf(grpc::CallbackServerContext* ctx, uint32_t timeout_ms);

  const Authenticator* const auth_;
  Coordinator* const coordinator_;
  KvStore* const kv_;
  const std::string coordinator_address_;
  absl::Mutex epoch_keys_mu_;
  std::deque<std::string> epoch_keys_ ABSL_GUARDED_BY(epoch_keys_mu_);  // oldest first
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_CLUSTER_SERVICE_H_
