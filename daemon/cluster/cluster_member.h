// This daemon's membership through the coordinator (cluster.store: embedded;
// the Membership interface): joins the coordinator at start
// (retrying until cluster.join_timeout_ms), heartbeats every
// cluster.heartbeat_ms, and keeps the epoch and a sparse view of the nodes:
// the ones whose changes concern it (lost, restarted, rejoined; not first
// joins: HeartbeatRequest.news_only, MemberView). Changes become PeerEvents
// (a node lost, a node joined) delivered on the heartbeat thread; `hsdpctl
// nodes` completes the view from the coordinator's whole list (ClusterView).
//
// When the coordinator stops answering for missed_heartbeats intervals the
// member logs an error and reports the cluster as "degraded" (membership
// frozen, losses no longer detected); it keeps trying, and joins again when a
// coordinator answers (docs/cluster.md).
//
// Group events: ReportGroupEvent queues an event (a cross-node group's
// epoch failed here) that the heartbeat thread sends to the coordinator at
// once; events other nodes reported arrive with heartbeats and are handed to
// `group_events` on the heartbeat thread. A member that learns it was
// declared lost reports every other node lost (kLost) before joining again,
// since the others failed the epochs of the groups it shares with them.
//
// Thread-safe. Start blocks (joining) until it joined, failed, or Stop was
// called; the rest never blocks on the network.
#ifndef HSDP_DAEMON_CLUSTER_CLUSTER_MEMBER_H_
#define HSDP_DAEMON_CLUSTER_CLUSTER_MEMBER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/join_retry.h"
#include "daemon/cluster/member_status.h"
#include "daemon/cluster/member_view.h"
#include "daemon/cluster/membership.h"
#include "hsdp/v1/admin.pb.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

class ClusterMember : public Membership {
 public:
  struct Options {
    std::string coordinator;  // HOST:PORT
    std::string address;      // cluster.listen
    std::string data_address;
    std::string name;
    uint32_t nodes = 1;
    int node_rank = -1;
    std::string token;  // "" = no token
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;  // null = plaintext
    bool is_coordinator = false;
    absl::Duration join_timeout = absl::Seconds(60);
    absl::Duration heartbeat = absl::Seconds(1);
    uint32_t missed_heartbeats = 5;
  };

  ClusterMember(Options options, PeerEvents events, GroupEvents group_events = nullptr);
  ~ClusterMember() override;  // Stop()

  // Joins (JoinRetry: attempts of at most 1 s, pauses up to 200 ms), then
  // starts the heartbeat thread. UNAUTHENTICATED / PERMISSION_DENIED /
  // FAILED_PRECONDITION / ALREADY_EXISTS / RESOURCE_EXHAUSTED from the
  // coordinator end it at once; DEADLINE_EXCEEDED names the last error when
  // time runs out.
  absl::Status Start() override ABSL_LOCKS_EXCLUDED(mu_);
  // Idempotent; also ends a Start in progress (CANCELLED). Sends what is
  // still queued for the coordinator once more (bounded by one call's timeout).
  void Stop() override ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `event` for the coordinator (never blocks; the oldest queued
  // event is dropped beyond kMaxOutbox, with a log line).
  void ReportGroupEvent(v1::GroupEvent event) override ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kMaxOutbox = 1024;

  // The nodes this member heard of (a sparse view: MemberView).
  v1::NodesResponse View() const override ABSL_LOCKS_EXCLUDED(mu_);
  // View() completed with the nodes it never heard of, from the
  // coordinator's whole list (Cluster.List, at most kListTimeout; as this
  // member counts them at its epoch: MemberView::AddUnheard); View() alone
  // when the member is not in contact ("ok") or the coordinator does not
  // answer within kListTimeout.
  v1::NodesResponse ClusterView() const override ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kListTimeout = absl::Seconds(1);
  uint64_t epoch() const override ABSL_LOCKS_EXCLUDED(mu_);
  int node_rank() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string instance() const override { return instance_; }
  // Calls this member made to the coordinator (Join, Heartbeat, Report).
  uint64_t rpcs() const { return rpcs_.load(std::memory_order_relaxed); }

 private:
  absl::Status JoinOnce(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies an answer's list (whole, or the changes with `delta`) to the
  // view, firing events for differences (outside the lock). O(entries in
  // the answer): nothing to do for a heartbeat while the epoch stands still.
  void Update(uint64_t epoch, const MemberView::Nodes& nodes, bool delta)
      ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends queued events; false when the coordinator refused or is unreachable.
  bool FlushOutbox() ABSL_LOCKS_EXCLUDED(mu_);
  bool WakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const v1::HeartbeatResponse& r) ABSL_LOCKS_EXCLUDED(mu_);
  // Declared lost (`why`): every other node counts as lost until this one
  // joined again; then one join attempt.
  absl::Status Rejoin(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const PeerEvents events_;
  const GroupEvents group_events_;
  const std::string instance_;
  ClusterClient client_;
  JoinRetry join_;

  mutable absl::Mutex mu_;
  MemberStatus status_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  MemberView view_ ABSL_GUARDED_BY(mu_);  // the nodes and the epoch
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t events_after_ ABSL_GUARDED_BY(mu_) = 0;  // group event cursor
  GroupEventOutbox outbox_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> rpcs_{0};
  std::thread heartbeat_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_CLUSTER_MEMBER_H_
