// The coordinator's membership: node ranks, addresses, heartbeats and the
// epoch. Nodes join (a rank by request, by address on a rejoin, or by join
// order; the coordinator's own address gets rank 0), heartbeat every
// heartbeat_ms, and are declared lost after missed_heartbeats intervals of
// silence. The epoch advances whenever a node joins, rejoins as a new
// instance or is lost.
//
// It also relays group events (a cross-node group's epoch failed on one
// node): Report appends them to a bounded log with sequence numbers, and
// each heartbeat answers with the events after the member's cursor.
//
// Thread-safe (one mutex); a monitor thread (Start/Stop) declares losses.
// Calls never block beyond the mutex.
#ifndef HSDP_DAEMON_CLUSTER_COORDINATOR_H_
#define HSDP_DAEMON_CLUSTER_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

  // Appends the events of live member (node_rank, instance) to the log.
  // FAILED_PRECONDITION for a node that is not a live member,
  // INVALID_ARGUMENT for more than kMaxReportEvents events or oversized
  // fields (nothing is appended then).
  absl::Status Report(const v1::ReportRequest& req) ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr size_t kMaxReportEvents = 64;
  static constexpr size_t kMaxEventLog = 4096;
  static constexpr size_t kMaxEventsPerHeartbeat = 256;
  static constexpr size_t kMaxEventField = 1024;

  uint64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  // Declares nodes silent for too long (on the clock) lost; called by the
  // monitor thread (public for tests).
  void CheckLiveness() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Node {
    bool used = false;
    bool alive = false;
    std::string address, data_address, name, instance;
    absl::Time last_heartbeat;
    uint64_t changed_epoch = 0;  // the epoch in which this entry last changed
  };
  bool IsLiveLocked(int rank, const std::string& instance) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillEvents(uint64_t after, v1::HeartbeatResponse* resp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entries that changed after epoch `changed_after` (0: every entry).
  void FillNodes(google::protobuf::RepeatedPtrField<v1::ClusterNode>* out, absl::Time now,
                 uint64_t changed_after = 0) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The clock's time as an absl::Time (only differences of two are used).
  absl::Time Now() const { return absl::FromUnixNanos(clock_->NowNanos()); }

  const Options options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::GroupEvent> events_ ABSL_GUARDED_BY(mu_);  // seq ascending, bounded
  uint64_t last_event_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_COORDINATOR_H_
