// A communication group on this node: matches the members' n-th
// submissions, checks they agree, runs matched operations in sequence order
// on the engine, and reports every outcome to every member — success, a
// disagreement, a timeout naming who is missing, or a member that left.
//
// Sequence numbers: every member numbers its submissions to a group 1, 2, 3
// (the client library does this). Operation n starts when all members'
// n-th submissions are in and operation n-1 has finished. Submissions may
// arrive out of order (the second phase of a composite op arrives when its
// first phase ends), so matching is keyed by sequence number.
//
// Thread-safety: all public methods are thread-safe. mu_ is never held while
// calling the engine, completing sessions or calling into another group.
#ifndef HSDP_DAEMON_DATAPLANE_GROUP_H_
#define HSDP_DAEMON_DATAPLANE_GROUP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"
#include "daemon/session/session.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

class Group;
using GroupLookup = std::function<std::shared_ptr<Group>(uint32_t group_id)>;

// One member's submission of one operation, validated and resolved.
struct Arrival {
  std::shared_ptr<Session> session;
  shm::OpDescriptor desc{};
  uint64_t seq = 0;      // sequence number in the group it arrives at
  bool phase2 = false;   // second phase of a reduce-scatter+all-reduce
  int shard_size = 0;    // phase 2: size of the member's shard group
  const void* send = nullptr;
  void* recv = nullptr;
  std::shared_ptr<MappedBuffer> send_buf;  // keep the mappings alive
  std::shared_ptr<MappedBuffer> recv_buf;
  int64_t first_ns = 0;   // when the operation first entered the daemon
  absl::Status rejected;  // not OK: this member's submission was invalid
};

struct GroupStats {
  uint64_t ops_started = 0;
  uint64_t ops_failed = 0;
  size_t pending = 0;
  bool broken = false;
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  Group(uint32_t id, std::string job_id, std::vector<int> ranks, Engine* engine,
        GroupLookup lookup, int64_t timeout_ns);

  uint32_t id() const { return id_; }
  const std::string& job_id() const { return job_id_; }
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  // Index of `global_rank` in ranks(), or -1.
  int RankOf(int global_rank) const;

  // Registers `session` as member `group_rank` (its NewGroup call).
  // ALREADY_EXISTS if another live session holds that rank.
  absl::Status Join(int group_rank, std::shared_ptr<Session> session);
  // True when `session` joined as `group_rank`.
  bool IsMember(int group_rank, const Session* session) const;

  // Adds a submission. Completes it at once (to its session) when it is
  // malformed for this group, when the group is broken, or when its
  // sequence number already failed.
  void Arrive(int group_rank, Arrival arrival);

  // The member's session ended: pending operations fail with ABORTED and the
  // group refuses further work (FAILED_PRECONDITION).
  void MemberLeft(const Session* session, const std::string& why);

  // Fails partially matched operations older than the timeout.
  void CheckTimeouts(int64_t now_ns);

  GroupStats stats() const;

 private:
  struct PendingOp {
    uint64_t seq = 0;
    std::vector<std::optional<Arrival>> arrivals;  // by group rank
    int arrived = 0;
    int64_t first_ns = 0;
  };

  std::string Describe(const PendingOp& op) const;
  std::string RanksList(const std::vector<int>& group_ranks) const;
  // Empty when all arrivals agree; otherwise names the fields and ranks.
  std::string Disagreement(const PendingOp& op) const;
  EngineTask Lower(const PendingOp& op) const;

  // Takes `op` out of pending_, records the failure for late arrivals and
  // returns the arrivals to notify.
  std::vector<Arrival> FailLocked(uint64_t seq, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneFailedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Starts ready operations in order until one is in flight.
  void Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone(PendingOp op, int64_t start_ns, absl::Status status, uint64_t exec_ns);
  // Sends each arrival its completion (or, for a composite first phase, on to
  // its replicate group).
  void Notify(std::vector<Arrival> arrivals, const absl::Status& status, uint64_t queued_ns,
              uint64_t exec_ns);
  void ForwardPhase2(std::vector<Arrival> arrivals, const absl::Status& status,
                     int64_t start_ns);

  const uint32_t id_;
  const std::string job_id_;
  const std::vector<int> ranks_;
  Engine* const engine_;
  const GroupLookup lookup_;
  const int64_t timeout_ns_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Session>> members_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, PendingOp> pending_ ABSL_GUARDED_BY(mu_);
  // Failed sequence numbers, so late arrivals get the same answer.
  std::map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_run_ ABSL_GUARDED_BY(mu_) = 1;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t ops_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ops_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_GROUP_H_
