// The coordinator's membership: node ranks, addresses, heartbeats and the
// epoch. Nodes join (a rank by request, by address on a rejoin, or by join
// order; the coordinator's own address gets rank 0), heartbeat every
// heartbeat_ms, and are declared lost after missed_heartbeats intervals of
// silence. The epoch advances when a node joins, rejoins as a new instance
// or is lost.
//
// Epoch steps and snapshots (docs/cluster.md "Epoch"): a change is recorded
// in the node table at once (a joining node has its rank and is live on
// return), and published in the next epoch step as an immutable NodeSnapshot
// (the table's entries, each with the epoch it last changed in). Joins are
// batched: the monitor thread steps at most kStepDelay-or-heartbeat/4 after
// the first unpublished join, folding in every join that arrived meanwhile;
// losses step at once. Answers name the published epoch and are built from
// its snapshot outside the lock, so the work per request under the mutex is
// O(1); a heartbeat naming nodes_epoch E gets every entry changed after E
// (with news_only, those that are not first joins: NodeSnapshot "News"),
// and an entry recorded but not yet published is in a later epoch's delta
// for everyone (its changed epoch will exceed every published one).
//
// It also relays group events (a cross-node group's epoch failed on one
// node): Report appends them to a bounded log with sequence numbers, and
// each heartbeat answers with the events after the member's cursor.
//
// Thread-safe. Lock order: step_mu_ (one epoch step at a time) before mu_
// (the table). A monitor thread (Start/Stop) steps and declares losses.
// Calls never block beyond the mutex (Join: and one step, when the joining
// node saw a later epoch than the published one).
#ifndef HSDP_DAEMON_CLUSTER_COORDINATOR_H_
#define HSDP_DAEMON_CLUSTER_COORDINATOR_H_

#include <cstdint>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/node_snapshot.h"
#include "daemon/util/clock.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

class Coordinator {
 public:
  struct Options {
    std::string self_address;  // cluster.listen of the coordinator
    uint32_t nodes = 1;
    uint32_t heartbeat_ms = 1000;
    uint32_t missed_heartbeats = 5;
    // What liveness is measured on: a monotonic clock, so a step of the
    // wall clock (NTP, an operator) never declares nodes lost. Null:
    // Clock::Real(); tests pass a FakeClock.
    const Clock* clock = nullptr;
    // The most node entries a heartbeat's delta carries (whole epochs; the
    // answer then names the last epoch it covers and the member asks from
    // there): after a join storm, every member's backlog of N entries
    // drains over a few heartbeats instead of making one answer of N.
    size_t max_nodes_per_heartbeat = 512;
  };

  explicit Coordinator(Options options);
  ~Coordinator();  // Stop()

  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // INVALID_ARGUMENT for a malformed request, FAILED_PRECONDITION when the
  // node's cluster.nodes disagrees or its requested rank conflicts with its
  // address, ALREADY_EXISTS when the requested rank is held by another live
  // node, RESOURCE_EXHAUSTED when every rank is held by a live node.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION when (rank, instance) is not a live member: the node
  // must join again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The whole list of the published epoch, with ages (`hsdpctl nodes` on a
  // member with a sparse view). O(nodes), outside the lock.
  v1::ListResponse List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Appends the events of live member (node_rank, instance) to the log.
  // FAILED_PRECONDITION for a node that is not a live member,
  // INVALID_ARGUMENT for more than kMaxReportEvents events or oversized
  // fields (nothing is appended then).
  absl::Status Report(const v1::ReportRequest& req) ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr size_t kMaxReportEvents = 64;
  static constexpr size_t kMaxEventLog = 4096;
  static constexpr size_t kMaxEventsPerHeartbeat = 256;
  static constexpr size_t kMaxEventField = 1024;

  // The most a join waits for its epoch step (the monitor's fold-in time),
  // unless heartbeat_ms / 4 is shorter.
  static constexpr absl::Duration kStepDelay = absl::Milliseconds(50);

  // The published epoch.
  uint64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  // Declares nodes silent for too long (on the clock) lost and publishes
  // the losses at once; called by the monitor thread (public for tests).
  void CheckLiveness() ABSL_LOCKS_EXCLUDED(mu_, step_mu_);
  // Publishes the changes recorded since the last step as the next epoch
  // (nothing when there are none); called by the monitor thread (public
  // for tests, which step by hand).
  void Step() ABSL_LOCKS_EXCLUDED(mu_, step_mu_);

 private:
  struct Node {
    bool used = false;
    bool alive = false;
    bool pending = false;  // changed since the last step (listed in pending_)
    std::string address, data_address, name, instance;
    std::string previous_instance;  // the rank's holder before `instance` ("" if none)
  };
  bool IsLiveLocked(int rank, const std::string& instance) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates a join request against this cluster (no lock: options only).
  absl::Status CheckJoinRequest(const v1::JoinRequest& req) const;
  // The rank `req` gets, or why none.
  absl::StatusOr<int> PickRankLocked(const v1::JoinRequest& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues rank's entry for the next step.
  void MarkChangedLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ClusterNode EntryLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillEvents(uint64_t after, v1::HeartbeatResponse* resp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets each entry's age from heard_ns_ (lost: since its last heartbeat).
  void SetAges(google::protobuf::RepeatedPtrField<v1::ClusterNode>* nodes) const;
  void MonitorLoop() ABSL_LOCKS_EXCLUDED(mu_, step_mu_);
  bool MonitorWakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !pending_.empty();
  }

  int64_t NowNs() const { return clock_->NowNanos(); }

  const Options options_;
  const Clock* const clock_;
  absl::Mutex step_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  // The last heartbeat (or join) of each rank on the clock, in ns: written
  // under mu_, read without it when answers are filled.
  std::unique_ptr<std::atomic<int64_t>[]> heard_ns_;
  std::shared_ptr<const NodeSnapshot> published_ ABSL_GUARDED_BY(mu_);
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);  // ranks changed since the last step
  // The epoch the next step publishes (above a joining node's last_epoch).
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<v1::GroupEvent> events_ ABSL_GUARDED_BY(mu_);  // seq ascending, bounded
  uint64_t last_event_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_COORDINATOR_H_
