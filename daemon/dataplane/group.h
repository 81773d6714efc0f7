// A communication group as this daemon sees it: matches its local members'
// n-th submissions, checks they agree, hands matched operations to the
// engine in sequence order, and reports every outcome to every local member
// — success, a disagreement, a timeout naming who is missing, a member or a
// peer node lost, a running operation past its deadline.
//
// Members: every rank of the group is either a local session (it submits
// through this daemon's rings) or a remote member hosted by another node's
// daemon (the engine reaches it through its transport). An operation starts
// when all LOCAL members' submissions are in; remote members are matched by
// their own daemons.
//
// Epochs: a group runs in epoch 1, 2, ... (or from spec.first_epoch).
// Sequence numbers restart at 1 in every epoch. When a member is lost (its
// session ended, its node failed, another daemon reported the epoch failed)
// or a running operation overruns its deadline, the epoch fails: every
// pending and running operation of it fails at every local member, and
// later submissions for it fail with the same error. The group is re-formed
// when every local member has joined again (Join) for the next epoch;
// remote members join each next epoch implicitly (their daemons re-form the
// group the same way, and the engine's per-(key, epoch) connection is the
// real barrier), except the ranks of a lost node until it joins again
// (PeerJoined / RemoteJoined). Submissions for the next epoch may queue
// before that. A failure that starts here (a local member left, an
// operation overran or failed in a cross-node group) is reported through
// spec.on_epoch_failed so the other daemons fail the same epoch.
//
// Pipelining: the next operation is handed to the engine as soon as the
// previous one is *launched* (ordered by the engine), not finished; the
// second phase of a composite reduce-scatter+all-reduce is forwarded to the
// replicate group when the first phase is launched, depending on it.
//
// Thread-safety: all public methods are thread-safe. mu_ is never held while
// calling the engine, completing sessions or calling into another group.
//
// Files (one class): group.cc (construction, submissions matched, stats;
// whether they agree is agreement.h, a rule of its own), group_epochs.cc
// (joining, epochs failing and re-forming, a member or a peer node lost),
// group_pipeline.cc (lowering to the engine, launching in order,
// completions, the composite's second phase), group_timeouts.cc (acting on
// matching timeouts and running operations' deadlines) and group_p2p.cc
// (send and receive). Two concepts with state and rules of their own are
// classes of their own, which Group owns and calls under mu_: OpMatcher
// (op_matcher.h: the table of partially matched operations by (epoch, seq),
// the sequence window, failed sequence numbers remembered for late
// submissions) and OpDeadlines (op_deadlines.h: which waiting or running
// operations are past the timeout, at an explicit time). Arrival (a member's
// submission) is in arrival.h.
#ifndef HSDP_DAEMON_DATAPLANE_GROUP_H_
#define HSDP_DAEMON_DATAPLANE_GROUP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <tuple>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/dataplane/arrival.h"
#include "daemon/dataplane/op_deadlines.h"
#include "daemon/dataplane/op_matcher.h"
#include "daemon/dataplane/small_op_arena.h"
#include "daemon/engine/engine.h"
#include "daemon/session/session.h"
#include "daemon/util/clock.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

class Group;
class OpObserver;
using GroupLookup = std::function<std::shared_ptr<Group>(uint32_t group_id)>;

struct GroupSpec {
  uint32_t id = 0;          // this daemon's handle (what descriptors name)
  std::string key;          // global: the same on every daemon (GroupKey())
  std::string job_id;       // the job's name ...
  uint32_t owner_uid = 0;   // ... and owner (JobKey): same-named jobs of two uids are two jobs
  std::vector<int> ranks;   // global ranks, by group rank
  std::vector<int> nodes;   // node of each rank; empty: all on this node
  int this_node = 0;
  int64_t timeout_ns = 60'000'000'000;  // matching timeout and running-op deadline
  uint32_t max_pending = 4096;          // queued operations (and sequence window)
  OpObserver* observer = nullptr;       // sees every operation (metrics, trace); may be null
  // When submissions arrive (Arrival::arrived_ns, hence who arrived last and
  // how long the others waited): null = Clock::Real(), the scale of
  // shm::NowNanos. Tests pass a FakeClock. Must outlive the group.
  const Clock* clock = nullptr;
  uint32_t first_epoch = 1;             // the epoch it starts in (ClusterDirectory::FirstEpoch)
  uint32_t qos_class = 4;               // the job's priority level (EngineTask::qos_class)
  // Cross-node groups: called (without the group's lock) when an epoch fails
  // for a reason that started on this node, with the last operation of that
  // epoch completed here (its seq; 0: none). May be empty.
  std::function<void(uint32_t epoch, const absl::Status& why, uint64_t completed_seq)>
      on_epoch_failed;
};

// The global key of the `k`-th group job `job` creates with `ranks` (k from
// 0): every daemon hosting a member derives the same string. It starts with
// the job's owner (JobKey::Encoded), so two users' same-named jobs never
// share engine state, links or cluster keys.
std::string GroupKey(const JobKey& job, const std::vector<int>& ranks, int k);

// How often, and for how long in total, the others waited for a rank that
// arrived last (the raw material of straggler reports).
struct RankWait {
  uint64_t times_last = 0;
  uint64_t waited_ns = 0;
};

struct GroupStats {
  uint64_t ops_started = 0;
  uint64_t ops_failed = 0;
  size_t pending = 0;
  size_t running = 0;
  uint32_t epoch = 1;
  bool broken = false;  // the current epoch failed; waiting to be re-formed
  std::vector<RankWait> waits;  // by group rank (local members only)
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  Group(GroupSpec spec, Engine* engine, GroupLookup lookup);

  uint32_t id() const { return spec_.id; }
  const std::string& key() const { return spec_.key; }
  const std::string& job_id() const { return spec_.job_id; }
  const JobKey& job() const { return job_; }
  const std::vector<int>& ranks() const { return spec_.ranks; }
  int size() const { return static_cast<int>(spec_.ranks.size()); }
  // Index of `global_rank` in ranks(), or -1.
  int RankOf(int global_rank) const;
  bool IsLocal(int group_rank) const;
  uint32_t epoch() const;

  // Registers `session` as local member `group_rank` and returns the epoch
  // it must submit in: the current one, or — when the current epoch failed —
  // the next one, which starts once every member joined it.
  // ALREADY_EXISTS if another live session holds the rank.
  absl::StatusOr<uint32_t> Join(int group_rank, std::shared_ptr<Session> session);
  // True when `session` joined as `group_rank`.
  bool IsMember(int group_rank, const Session* session) const;
  // A remote member joined `epoch` (told by its daemon).
  void RemoteJoined(int group_rank, uint32_t epoch);
  // Node `node` joined (again): its ranks, lost with it, join the next epoch.
  void PeerJoined(int node);
  // Another daemon reported that `epoch` of this group failed: it fails here
  // too (now, or when this daemon reaches it). Operations of that epoch up
  // to `completed_seq` completed there: running here, they finish rather
  // than being aborted (every node's part of them is done or in flight).
  void RemoteEpochFailed(uint32_t epoch, const absl::Status& why, uint64_t completed_seq = 0);
  // Whether some members are on other nodes.
  bool spans_nodes() const { return local_ranks_.size() < spec_.ranks.size(); }
  // The small-operation arena (an all-local group's, for the epoch it was
  // made in; null: none). Marked broken when that epoch fails.
  void SetArena(std::shared_ptr<SmallOpArena> arena) ABSL_LOCKS_EXCLUDED(mu_);
  // The arena members joining in `epoch` use: null when there is none, it
  // is for another epoch, or it is broken.
  std::shared_ptr<SmallOpArena> ArenaFor(uint32_t epoch) const ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the arena broken with `why` (the daemon is going away).
  void BreakArena(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // The daemon is going away: the current epoch fails with `why` for every
  // member (and is reported to the other daemons) while the members'
  // sessions are still open, so each waiting operation carries `why` rather
  // than a session's generic end.
  void DaemonLeaving(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Operations completed in the arena (0 without one), for metrics.
  uint64_t ArenaOpsCompleted() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every engine group this group created: its key, and one per
  // (source, destination, tag) of point-to-point between nodes.
  std::vector<std::string> engine_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  // Distinct (source, destination, tag) of point-to-point between nodes per
  // group (each is an engine link): more is RESOURCE_EXHAUSTED.
  static constexpr size_t kMaxRemoteP2PStreams = 256;
  const std::vector<int>& nodes() const { return spec_.nodes; }

  // Adds a submission. Completes it at once (to its session) when it is
  // malformed for this group, when its epoch is over, when its sequence
  // number already failed, or when the group has too much queued.
  void Arrive(int group_rank, Arrival arrival);

  // A local member's session ended / the node hosting remote members was
  // lost: the current epoch fails with ABORTED naming the ranks.
  void MemberLeft(const Session* session, const std::string& why);
  // `old_instance` (not empty): the node is already back with a new daemon,
  // and this is the instance that ended (lost and joined in one view of the
  // membership, which may come only after the new daemon created the group
  // anew and ran operations with this one). An epoch still running whose
  // links (the engine's PeerInstances) reach only the new daemon, or none
  // yet, is then left alone: it may be the new daemon's first epoch, which
  // its members never leave by themselves, so failing it would leave them
  // stuck in it. Otherwise (a link to the old instance, an engine that
  // cannot tell, an epoch that already failed) it is a loss as any other.
  // `node` kEveryRemoteNode: every node but this one (a member that joins
  // the cluster again without having known every node).
  void PeerLost(int node, const std::string& why, const std::string& old_instance = "");
  static constexpr int kEveryRemoteNode = -1;

  // Fails partially matched operations older than the timeout, unmatched
  // sends and receives older than it, and running operations past their
  // deadline (aborting them in the engine).
  void CheckTimeouts(int64_t now_ns);

  GroupStats stats() const;

 private:
  struct RunningOp {
    PendingOp op;
    int64_t start_ns = 0;
    uint64_t ticket = 0;         // 0 until the engine named it
    bool forwarded = false;      // composite: phase 2 already handed on
    std::atomic<bool> finished{false};
  };
  using OpKey = OpMatcher::Key;  // (epoch, seq)

  std::string Describe(const PendingOp& op) const;
  std::string RanksList(const std::vector<int>& group_ranks) const;
  EngineTask Lower(const PendingOp& op) const;
  const Arrival& AnyArrival(const PendingOp& op) const;

  // Fails (epoch, seq) in matcher_ (remembered for late arrivals), counts
  // it, and returns the arrivals to notify.
  std::vector<Arrival> FailLocked(OpKey key, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a link of `epoch` reaches daemon `instance` of node `node` (or
  // the engine cannot tell).
  bool LinkedToInstance(uint32_t epoch, int node, const std::string& instance) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the current epoch: returns what to notify and the tickets to abort
  // (running operations after `spare_through`, a seq: those up to it go on).
  // Returns false when the epoch had already failed.
  bool FailEpochLocked(const absl::Status& status, std::vector<Arrival>* to_fail,
                       std::vector<uint64_t>* to_abort, uint64_t spare_through = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `epoch` if it is the current one (0: whichever is current);
  // `report`: the failure started here (spec.on_epoch_failed hears of it,
  // with `cause` when given: the other daemons describe the operation
  // themselves, and a completion message has room for 208 bytes only).
  // `spare_through`: as for FailEpochLocked.
  void FailEpoch(const absl::Status& status, uint32_t epoch = 0, bool report = false,
                 const absl::Status* cause = nullptr, uint64_t spare_through = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Enters the next epoch when every member joined it.
  void MaybeAdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordWaitsLocked(const PendingOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Launches ready operations in order while the engine keeps launching.
  void Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void OnLaunched(const std::shared_ptr<RunningOp>& run, uint64_t ticket);
  void OnCompleted(const std::shared_ptr<RunningOp>& run, absl::Status status, uint64_t exec_ns);
  // Sends each arrival its completion (a composite first phase goes on to
  // its replicate group instead).
  void Notify(std::vector<Arrival> arrivals, const absl::Status& status, uint64_t queued_ns,
              uint64_t exec_ns);
  void ForwardPhase2(std::vector<Arrival> arrivals, const absl::Status& status,
                     uint64_t depends_on);

  // --- point-to-point (send / recv): matched by (source, destination, tag)
  // in posting order, outside the collective sequence.
  struct P2POp {
    Arrival arrival;
    int rank = 0;        // group rank of the poster
    uint64_t order = 0;  // arrival order in this group
  };
  using P2PKey = std::tuple<int, int, int>;  // (source, destination, tag); source may be any
  void ArriveP2P(int group_rank, Arrival arrival);
  // The oldest queued counterpart of a send (src, dst, tag) / a receive.
  std::optional<P2POp> TakeRecvForLocked(int src, int dst, int tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<P2POp> TakeSendForLocked(int src, int dst, int tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchP2P(P2POp send, P2POp recv);
  // One side of a send/recv between nodes: the k-th send of (src, dst, tag)
  // here pairs with the k-th receive of it on the peer's daemon.
  void LaunchRemoteP2P(P2POp mine, int src, int dst, int tag, uint64_t k);
  std::vector<P2POp> TakeAllP2PLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupSpec spec_;
  const Clock* const clock_;        // spec_.clock, or the real one
  const JobKey job_;                // {spec_.owner_uid, spec_.job_id}
  const std::string job_encoded_;   // job_.Encoded(), for every engine task
  Engine* const engine_;
  const GroupLookup lookup_;
  std::vector<int> local_index_;   // by group rank: index among local members, or -1
  std::vector<int> local_ranks_;   // group ranks of local members
  const OpDeadlines deadlines_;    // spec_.timeout_ns

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Session>> members_ ABSL_GUARDED_BY(mu_);  // by group rank
  std::vector<uint32_t> joined_epoch_ ABSL_GUARDED_BY(mu_);             // by group rank
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status epoch_failure_ ABSL_GUARDED_BY(mu_);  // not OK: the current epoch failed
  // The last operation of the current epoch that completed here (its seq).
  uint64_t completed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<SmallOpArena> arena_ ABSL_GUARDED_BY(mu_);
  // Partially matched operations, the next sequence number to run and the
  // failed ones of the current epoch (it sequences epoch_).
  OpMatcher matcher_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<RunningOp>> running_ ABSL_GUARDED_BY(mu_);
  bool awaiting_launch_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t ops_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ops_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RankWait> waits_ ABSL_GUARDED_BY(mu_);  // by group rank
  std::map<P2PKey, std::deque<P2POp>> p2p_sends_ ABSL_GUARDED_BY(mu_);
  std::map<P2PKey, std::deque<P2POp>> p2p_recvs_ ABSL_GUARDED_BY(mu_);
  size_t p2p_queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t p2p_order_ ABSL_GUARDED_BY(mu_) = 0;
  // Cross-node point-to-point: operations posted so far per (src, dst, tag)
  // in this epoch, and the engine tickets still running (aborted with the epoch).
  std::map<P2PKey, uint64_t> p2p_posted_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint32_t> p2p_running_ ABSL_GUARDED_BY(mu_);  // ticket -> epoch
  std::set<std::string> p2p_engine_keys_ ABSL_GUARDED_BY(mu_);  // bounded by kMaxRemoteP2PStreams
  // Epochs other daemons reported failed that this one has not reached yet.
  std::map<uint32_t, absl::Status> remote_failed_ ABSL_GUARDED_BY(mu_);
  // Submissions failed (and engine tickets to abort) when the group entered
  // an epoch another daemon had already failed; Pump delivers them.
  std::vector<std::pair<Arrival, absl::Status>> deferred_failures_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> deferred_aborts_ ABSL_GUARDED_BY(mu_);
  // A node restarted while the current epoch ran without a link to its old
  // daemon (PeerLost): what later submissions hear if the epoch then fails on
  // a lost connection (a link still connecting reached the old daemon).
  absl::Status restart_cause_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_GROUP_H_
