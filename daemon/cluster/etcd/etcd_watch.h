// The etcd client's watch (etcd_client.h's Watch): a reader thread drains
// the gRPC stream into a queue; Next waits on it with its deadline; Cancel
// ends the stream. Failover and re-authentication are the client's
// (EtcdClient::StartWatch), which opens one of these per attempt.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client_internal.h"

namespace hsdp::etcd::internal {

// Opens a watch stream on `stub` (with `token` when not empty) and waits up
// to `timeout` for etcd's "created": the watch once created; otherwise the
// error that ended it, and `*stream_status` the gRPC status that ended the
// stream (for the caller's failover and re-authentication).
absl::StatusOr<std::unique_ptr<Watch>> OpenWatch(std::string name, std::string what,
                                                 std::shared_ptr<pb::Watch::Stub> stub,
                                                 std::string token,
                                                 const pb::WatchRequest& create,
                                                 absl::Duration timeout,
                                                 grpc::Status* stream_status);

}  // namespace hsdp::etcd::internal

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_
