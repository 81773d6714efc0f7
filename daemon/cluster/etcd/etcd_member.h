// This daemon's membership kept in etcd (cluster.store: etcd): no
// coordinator, so no single machine whose loss stops joins.
//
// Keys, under the cluster's prefix P (cluster.etcd.prefix; etcd_keys.h):
//   P m/config        "nodes=N layout=2": every node must agree
//   P m/epoch         the cluster epoch (decimal); watched by nobody
//   P n/<r>           node rank r's ClusterNode (address, instance, ...),
//                     under the node's lease: it lives while the node
//                     heartbeats (renewals on one keep-alive stream every
//                     heartbeat_ms; the lease's TTL is heartbeat_ms x
//                     missed_heartbeats). Watched by the sweeper alone.
//   P h/ranks/<r>     who last held rank r (address, instance; no lease)
//   P h/addr/<a>      the rank address a last held (no lease): a restarted
//                     node gets its rank back without reading the others
//   P w/news/<r>      rank r's last news: lost (by the sweeper), or alive
//                     again naming the instance it replaced (by the join)
//   P w/events/<r>    the group events node r reported last (its lease)
//   P w/sweeper       the sweeper's rank (its lease)
//
// Every member watches P w/ only, and keeps a sparse view (member_view.h):
// it hears of a rank when it is news (lost, restarted, back), never of a
// first join, which no group can have depended on. So a join storm of N
// nodes wakes nobody but the sweeper, and a loss costs one watch event per
// member. Join: EtcdJoin (a window of ranks, never the whole membership).
// Losses: the sweeper (etcd_sweeper.h), elected through P w/sweeper; when
// its key goes, members campaign (ranks 0-7 at once, later ranks a second
// per 8 ranks later, at most 3 s) and the new sweeper publishes the losses
// nobody published meanwhile. `hsdpctl nodes` (ClusterView) completes the
// view from a read of P n/.
//
// Like ClusterMember: PeerEvents for differences between views (on the
// watch thread), group events relayed to every other node, "degraded" when
// etcd has not answered for missed_heartbeats intervals (membership
// frozen), and a node whose lease expired reports every other node lost and
// joins again (reading every node key in that join).
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
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_join.h"
#include "daemon/cluster/etcd/etcd_keys.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "daemon/cluster/etcd/etcd_sweeper.h"
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
  // View() completed with every live node key in etcd (one read).
  v1::NodesResponse ClusterView() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t epoch() const override ABSL_LOCKS_EXCLUDED(mu_);
  int node_rank() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string instance() const override { return instance_; }
  // Calls this member made to etcd (directly or through `store`).
  uint64_t rpcs() const { return rpcs_.load(std::memory_order_relaxed); }
  // Whether this member is the sweeper now, and the losses it published.
  bool sweeping() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t losses_published() const ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr size_t kMaxOutbox = 1024;
  static constexpr size_t kMaxReportEvents = 64;
  static constexpr size_t kMaxEventField = 1024;
  static constexpr size_t kMaxNodeValue = etcd::EtcdJoin::kMaxNodeValue;
  static constexpr size_t kMaxEventsValue = 256 << 10;

 private:
  absl::Status JoinOnce(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLoop(int64_t from) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies one watched change; fills `out` with the PeerEvents to fire.
  void Apply(const etcd::WatchEvent& e, std::vector<PeerEvent>* out,
             std::vector<v1::GroupEvent>* group_out) ABSL_LOCKS_EXCLUDED(mu_);
  // Parses a node key's value (rank and state set); false when malformed.
  bool ParseNode(const etcd::KeyValue& kv, int rank, v1::ClusterNode* n) const;
  // Applies news (P w/news/<r>); events into `out`.
  void ApplyNewsLocked(int rank, const std::string& value, std::vector<PeerEvent>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a compaction: every news entry read at `revision`, applied again
  // (what this member already heard changes nothing).
  void Reread(const std::vector<etcd::KeyValue>& news) ABSL_LOCKS_EXCLUDED(mu_);
  // When this member campaigns after the sweeper's key went: ranks 0-7 at
  // once, later ones up to 3 s later (jittered).
  absl::Time CampaignTimeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tries to become the sweeper (one transaction); starts it when elected.
  void Campaign() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends this member's sweeper, if it runs one.
  void StopSweeper() ABSL_LOCKS_EXCLUDED(mu_);
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
  // The sweeper's key as the watch last saw it; when to campaign while it
  // is absent (InfiniteFuture: not).
  bool sweeper_seen_ ABSL_GUARDED_BY(mu_) = false;
  bool watching_ ABSL_GUARDED_BY(mu_) = false;  // Start began the watch
  absl::Time campaign_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::unique_ptr<etcd::EtcdSweeper> sweeper_ ABSL_GUARDED_BY(mu_);
  std::thread sweeper_thread_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> rpcs_{0};
  mutable absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
  std::thread heartbeat_;
  std::thread watcher_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_H_
