// This daemon's membership kept in etcd (cluster.store: etcd): no
// coordinator, so no single machine whose loss stops joins.
//
// Keys, under the cluster's prefix P (cluster.etcd.prefix):
//   P m/config        "nodes=N": every node must agree on cluster.nodes
//   P m/epoch         the cluster epoch (decimal)
//   P m/nodes/<r>     node rank r's ClusterNode (address, instance, ...),
//                     under the node's lease: it lives while the node
//                     heartbeats (LeaseKeepAlive every heartbeat_ms; the
//                     lease's TTL is heartbeat_ms x missed_heartbeats)
//   P h/ranks/<r>     the address that last held rank r (no lease), so a
//                     restarted node gets its rank back (outside m/: no
//                     watcher is woken for it)
//   P m/events/<r>    the group events node r reported last (its lease)
//
// Join (EtcdJoin): one transaction claims a rank (by request, by address,
// else a free one at random), compared against that rank's key only, so two
// nodes never take one rank and joins of different ranks never conflict (a
// lost race backs off, jittered); then "if the epoch was last written before
// my join, advance it" (a compare-and-put): the epoch moves on after every
// join, and joins that overlap may share one step. A loss: the node's key
// goes with its lease; every member's watch on P m/ sees the deletion, and
// the lost node's successor (the next live rank) advances the epoch the
// same way: one member's calls per loss, not N.
//
// Like ClusterMember: PeerEvents for differences between views (on the
// watch thread), group events relayed to every other node, "degraded" when
// etcd has not answered for missed_heartbeats intervals (membership
// frozen), and a node whose lease expired reports every other node lost and
// joins again.
//
// Thread-safe. Start blocks until joined, failed or stopped.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_join.h"
#include "daemon/cluster/etcd/etcd_keys.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "daemon/cluster/join_retry.h"
#include "daemon/cluster/member_status.h"
#include "daemon/cluster/member_view.h"
#include "daemon/cluster/membership.h"

namespace hsdp {

class EtcdMember : public Membership {
 public:
  struct Options {
    std::string prefix;  // cluster.etcd.prefix, ends with '/'
    std::string address;
    std::string data_address;
    std::string name;
    uint32_t nodes = 1;
    int node_rank = -1;
    absl::Duration join_timeout = absl::Seconds(60);
    absl::Duration heartbeat = absl::Seconds(1);
    uint32_t missed_heartbeats = 5;
    // false: Stop leaves the lease to expire (the others see a crash).
    bool revoke_on_stop = true;
  };

  // `etcd` and `store` (the cluster's key/value store in the same etcd, for
  // the lease of its keys and the group epoch hints) must outlive this.
  EtcdMember(etcd::EtcdClient* etcd, EtcdStore* store, Options options, PeerEvents events,
             GroupEvents group_events = nullptr);
  ~EtcdMember() override;  // Stop()

  absl::Status Start() override ABSL_LOCKS_EXCLUDED(mu_);
  // Also revokes the lease (unless !revoke_on_stop): the others see this
  // node leave at once.
  void Stop() override ABSL_LOCKS_EXCLUDED(mu_);
  void ReportGroupEvent(v1::GroupEvent event) override ABSL_LOCKS_EXCLUDED(mu_);
  v1::NodesResponse View() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t epoch() const override ABSL_LOCKS_EXCLUDED(mu_);
  int node_rank() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string instance() const override { return instance_; }
  // Calls this member made to etcd (directly or through `store`).
  uint64_t rpcs() const { return rpcs_.load(std::memory_order_relaxed); }

  static constexpr size_t kMaxOutbox = 1024;
  static constexpr size_t kMaxReportEvents = 64;
  static constexpr size_t kMaxEventField = 1024;
  static constexpr size_t kMaxNodeValue = etcd::EtcdJoin::kMaxNodeValue;
  static constexpr size_t kMaxEventsValue = 256 << 10;

 private:
  absl::Status JoinOnce(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLoop(int64_t from) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies one watched change; fills `out` with the PeerEvents to fire,
  // and `lost_at` with the revision of a loss this node must step the
  // epoch past (it is the lost node's successor).
  void Apply(const etcd::WatchEvent& e, std::vector<PeerEvent>* out,
             std::vector<v1::GroupEvent>* group_out, int64_t* lost_at) ABSL_LOCKS_EXCLUDED(mu_);
  // After a compaction: every node key read at `revision` is the live set.
  void Reread(const std::vector<etcd::KeyValue>& nodes, int64_t revision)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Parses a node key's value (rank and state set); false when malformed.
  bool ParseNode(const etcd::KeyValue& kv, int rank, v1::ClusterNode* n) const;
  // Whether this node moves the epoch on for the loss of `rank` (it is its
  // live successor).
  bool SuccessorOfLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lease gone: every other node counts as lost until this one joined again.
  void Rejoin(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  bool FlushOutbox() ABSL_LOCKS_EXCLUDED(mu_);
  bool WakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  etcd::EtcdClient* const etcd_;
  EtcdStore* const store_;
  const Options options_;
  const PeerEvents events_;
  const GroupEvents group_events_;
  const std::string instance_;
  const etcd::EtcdKeys keys_;
  etcd::EtcdJoin join_;
  JoinRetry retry_;

  mutable absl::Mutex mu_;
  MemberStatus status_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  MemberView view_ ABSL_GUARDED_BY(mu_);  // every node seen (self included), the epoch
  int64_t watch_from_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  GroupEventOutbox outbox_ ABSL_GUARDED_BY(mu_);
  etcd::Watch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the watch in use, for Stop
  std::atomic<uint64_t> rpcs_{0};
  std::thread heartbeat_;
  std::thread watcher_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_H_
