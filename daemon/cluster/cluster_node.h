// Everything a daemon runs for the cluster (NodeConfig::multi_node()).
// cluster.store: embedded — the TCP gRPC server on cluster.listen with the
// Cluster service, the authenticator, and, on the coordinator (listen ==
// coordinator), the membership and the key/value store; on every daemon a
// ClusterMember and a ClusterClient. cluster.store: etcd — an etcd client,
// an EtcdMember and an EtcdStore; nothing listens.
// Daemon owns one and calls Start, Cancel, Stop, member() and client().
#ifndef HSDP_DAEMON_CLUSTER_CLUSTER_NODE_H_
#define HSDP_DAEMON_CLUSTER_CLUSTER_NODE_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster_store.h"
#include "daemon/cluster/membership.h"
#include "daemon/config/node_config.h"

namespace grpc {
class Server;
}

namespace hsdp {

class Authenticator;
class ClusterServiceImpl;
namespace etcd {
class EtcdClient;
}
class Coordinator;
class KvStore;

class ClusterNode {
 public:
  // `config.multi_node()` must hold. `events` runs on the member's
  // heartbeat thread.
  ClusterNode(const NodeConfig& config, PeerEvents events, GroupEvents group_events = nullptr);
  ~ClusterNode();  // Stop()

  // Reads the token, starts the server, joins (blocking up to
  // cluster.join_timeout_ms). Errors name the key or address at fault.
  absl::Status Start();
  // Ends a Start in progress (from any thread, e.g. on SIGTERM): it returns
  // CANCELLED within about a second. Thread-safe.
  void Cancel();
  // Stops heartbeats, finishes pending waits, stops the server. Idempotent.
  void Stop();

  // Null before Start.
  const Membership* member() const { return member_.get(); }
  Membership* member() { return member_.get(); }
  // The cluster's key/value store (placement, Gloo rendezvous, NCCL ids).
  // Null before Start; lives until the ClusterNode is destroyed.
  ClusterStore* client() const { return store_.get(); }
  // On the coordinator (embedded store): the Wait and Barrier calls its
  // key/value store holds now; 0 elsewhere and before Start.
  size_t kv_waiters() const;

 private:
  const NodeConfig& config_;
  PeerEvents events_;
  GroupEvents group_events_;
  absl::Status StartEmbedded();
  absl::Status StartEtcd();
  // Publishes `member` and starts it (unless cancelled meanwhile).
  absl::Status StartMember(std::unique_ptr<Membership> member);

  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::unique_ptr<ClusterStore> store_;
  absl::Mutex cancel_mu_;
  bool cancelled_ ABSL_GUARDED_BY(cancel_mu_) = false;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<ClusterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Membership> member_;
  bool stopped_ = false;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_CLUSTER_NODE_H_
