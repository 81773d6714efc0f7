// One lease's keep-alive stream (etcd's Lease.LeaseKeepAlive is a
// bidirectional stream, with no unary form): opened once and kept, one
// request and one answer per renewal, instead of a stream of its own per
// renewal (a stream costs etcd far more than a message on an open one). The
// stream is gRPC's callback API: answers arrive on gRPC's threads, and an
// open stream holds no thread of its own; Renew writes a request and waits
// for the next answer with its deadline. Once anything fails (the stream ended, no
// answer in time) the stream is over and the caller opens another, on the
// member its failover picks. Failover and re-authentication are the
// client's (EtcdClient::LeaseKeepAlive), as for watches.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEEPALIVE_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEEPALIVE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client_internal.h"

namespace hsdp::etcd::internal {

class KeepAliveStream {
 public:
  virtual ~KeepAliveStream() = default;
  // Renews `lease` once: OK with etcd's answer (ttl() <= 0: the lease is
  // gone), else the gRPC status that ended the stream (DEADLINE_EXCEEDED
  // when no answer came by `deadline`). One renewal at a time.
  virtual grpc::Status Renew(int64_t lease, absl::Time deadline,
                             pb::LeaseKeepAliveResponse* answer) = 0;
  // The stream failed or was closed: open another.
  virtual bool over() const = 0;
  // The endpoint (an index into the client's) and the token it was opened with.
  virtual size_t endpoint() const = 0;
  virtual const std::string& token() const = 0;
};

// Opens a stream on `stub` (with `token` when not empty); it starts at once,
// a failure shows in the first Renew.
std::unique_ptr<KeepAliveStream> OpenKeepAlive(pb::Lease::Stub* stub, size_t endpoint,
                                               std::string token);

}  // namespace hsdp::etcd::internal

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEEPALIVE_H_
