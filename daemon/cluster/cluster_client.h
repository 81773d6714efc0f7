// A client of the coordinator's Cluster service over TCP: one channel, every
// call with the cluster token attached and a deadline. The embedded
// ClusterStore (the coordinator's key/value store), and ClusterMember's
// membership calls (Join, Heartbeat, Report, List). Thread-safe; every call blocks up to
// its timeout.
#ifndef HSDP_DAEMON_CLUSTER_CLUSTER_CLIENT_H_
#define HSDP_DAEMON_CLUSTER_CLUSTER_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/cluster/cluster_store.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "hsdp/v1/cluster.grpc.pb.h"

namespace hsdp {

class ClusterClient : public ClusterStore {
 public:
  // `token` "" sends no token. `credentials` null = plaintext TCP; else, e.g.,
  // ClusterTlsCredentials() for mutual TLS.
  ClusterClient(const std::string& coordinator, std::string token,
                std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  const std::string& coordinator() const { return coordinator_; }
  std::string name() const override;

  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& req, absl::Duration timeout);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req,
                                                  absl::Duration timeout);
  // The coordinator's whole node list (UNIMPLEMENTED from a coordinator
  // that predates List).
  absl::StatusOr<v1::ListResponse> List(absl::Duration timeout) const;
  absl::Status Set(const std::string& key, const std::string& value, absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, absl::Duration timeout) override;
  // Waits up to `timeout` for every key (DEADLINE_EXCEEDED after it).
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // Waits like Wait and returns the values, by key, in the same round trip.
  absl::StatusOr<std::vector<std::string>> WaitValues(const std::vector<std::string>& keys,
                                                      absl::Duration timeout) override;
  // Stores `value` unless `key` exists; returns the value stored now.
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key, const std::string& value,
                                          absl::Duration timeout) override;
  absl::Status Delete(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::Status Report(const v1::ReportRequest& req, absl::Duration timeout);
  absl::Status Barrier(const std::string& name, uint32_t count, absl::Duration timeout) override;

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;

  const std::string coordinator_;
  const std::string token_;
  std::unique_ptr<v1::Cluster::Stub> stub_;
};

// A gRPC status as an absl::Status, the message prefixed with `what`.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_CLUSTER_CLIENT_H_
