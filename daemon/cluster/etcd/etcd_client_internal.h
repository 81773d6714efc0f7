// Internal to the etcd client (etcd_client.cc, etcd_watch.cc): the
// conversions between its types and etcd's protos, the checks and words its
// errors use, and one endpoint's channel and stubs.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_INTERNAL_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_INTERNAL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"
#include "grpcpp/grpcpp.h"

namespace hsdp::etcd::internal {

namespace pb = ::etcdserverpb;

// etcd's require-leader metadata (clientv3's WithRequireLeader): a member
// without a leader fails the call (UNAVAILABLE "etcdserver: no leader") and
// cancels a watch, instead of blocking or staying silent.
inline constexpr char kHasLeaderKey[] = "hasleader";
inline constexpr char kTokenKey[] = "token";
// Larger than any response hsdpd reads (etcd's own limit on a request is
// 1.5 MiB; a range of many keys can exceed gRPC's default 4 MiB).
inline constexpr int kMaxReceiveBytes = 64 << 20;

// What etcd answers when the token is unknown to the member (a member that
// restarted forgot its simple tokens) or older than the auth store.
bool IsStaleToken(const grpc::Status& s);
absl::StatusCode ToAbsl(grpc::StatusCode code);
// A key for messages: quoted, non-printable bytes escaped.
std::string Quote(const std::string& key);
// A key or a [key, range_end) range for messages.
std::string RangeText(const std::string& key, const std::string& range_end);
// HOST:PORT with a port in 1..65535; HOST may be a bracketed IPv6 address.
absl::Status ValidateEndpoint(const std::string& ep);
KeyValue FromPb(const mvccpb::KeyValue& kv);
void ToPb(const Compare& c, pb::Compare* out);
void ToPb(const Op& op, pb::RequestOp* out);

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::shared_ptr<pb::Watch::Stub> watch;  // shared with the watches it started
  std::unique_ptr<pb::Auth::Stub> auth;
  std::unique_ptr<pb::Maintenance::Stub> maintenance;  // Status: who leads
};

}  // namespace hsdp::etcd::internal

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_INTERNAL_H_
