// The session manager: attached sessions, the jobs they form, buffer
// registration against the memory limits, and group creation. The gRPC
// services and the data-connection server call into it; the dispatcher reads
// it through SessionDirectory. No method blocks: RegisterBuffer waits for
// its fd through a callback and maps on the control executor.
//
// Isolation: a job is its owner's uid plus its name (JobKey; the rule that
// picks the job of an Attach is JobTable::Choose). Two users' jobs of the
// same name are two jobs; only root and the daemon's uid may join another
// user's job, by naming its owner.
//
// Limits are reserved atomically before the work they bound (buffer bytes
// and count per session, bytes and mappings per node, group members per job
// and per node) and released when the work fails. Every node-wide pool also
// has a share per uid (limits.uid_share_percent, root exempt): sessions and
// registered bytes are charged to the session's uid, group members and arena
// memory to the job's owner, placement waits to the caller.
//
// Cluster (a ClusterDirectory given): Attach places the rank in the
// cluster first (a conflicting world size or a rank attached on another
// node is an error), NewGroup resolves the node of every rank (waiting up to
// cluster.join_timeout_ms, without mu_) and creates a cross-node group when
// some are elsewhere, and group failures that start here are reported to
// the other daemons; OnGroupEvent / OnPeerLost / OnPeerJoined take theirs.
//
// Thread-safety: all methods are thread-safe. Lock order: mu_ before any
// Group's or Session's lock; Group::MemberLeft is called without mu_, and so
// is every ClusterDirectory call.
//
// Files (one class): session_manager.cc (attach, detach, sessions ending,
// housekeeping, the session lookups), session_buffers.cc (buffer
// registration), session_groups.cc (NewGroup, CreateGroup and placement
// across nodes; the cluster's events passed on to the groups). The concepts
// it holds are classes of their own: JobTable (the jobs), NodeLedger (the
// node's limits and per-uid shares, reserved and given back), RetiredGroups
// (cross-node engine state kept after its job ended), PlacementWaits (the
// bounded NewGroup calls waiting for placement).
#ifndef HSDP_DAEMON_JOBS_SESSION_MANAGER_H_
#define HSDP_DAEMON_JOBS_SESSION_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config/node_config.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/dataplane/group.h"
#include "daemon/engine/engine.h"
#include "daemon/jobs/cluster_directory.h"
#include "daemon/jobs/job_table.h"
#include "daemon/jobs/node_ledger.h"
#include "daemon/jobs/placement_waits.h"
#include "daemon/jobs/retired_groups.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

struct AttachParams {
  std::string job_id;
  // Whose job: unset means the caller's own (AttachRequest.owner_uid).
  std::optional<uint32_t> owner_uid;
  // Root or the daemon's uid (the server's Authenticator decides): may name
  // another owner.
  bool caller_is_admin = false;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string device = "cpu";
  int64_t pid = 0;
  uint32_t protocol_version = 0;
  uint64_t features = 0;  // shm::Feature bits the client offers
  std::string priority_class;  // "" = the class the job matches (priority_classes.h)
};

struct AttachResult {
  uint64_t session_id = 0;
  SessionToken token{};
  uint32_t ring_entries = 0;
  uint64_t features = 0;  // negotiated
};

struct NewGroupResult {
  uint32_t group_id = 0;
  int group_rank = 0;
  int group_size = 0;
  uint32_t epoch = 1;  // the epoch the member submits in
  // The group's small-operation arena for that epoch (null: none); the
  // caller sends its fd to the member before replying.
  std::shared_ptr<SmallOpArena> arena;
};

// NodeLimits, MappingBudget and KernelMaxMapCount: node_ledger.h.

class Executor;

class SessionManager : public SessionDirectory {
 public:
  // `control`: where buffer mapping runs (nullptr: inline, for tests).
  // `observer`: given to every group it creates (nullptr: none); must
  // outlive the manager.
  // `cluster`: placement and failure events across nodes (nullptr: a
  // single node); must outlive the manager.
  // `clock`: when retired cross-node groups' engine state is due
  // (RetiredGroups; nullptr: Clock::Real()); must outlive the manager.
  SessionManager(const NodeConfig& config, NodeLimits limits, Engine* engine,
                 Executor* control = nullptr, OpObserver* observer = nullptr,
                 ClusterDirectory* cluster = nullptr, const Clock* clock = nullptr);
  ~SessionManager() override;

  absl::StatusOr<AttachResult> Attach(const AttachParams& params, const PeerCred& caller);
  absl::Status Detach(uint64_t session_id, const PeerCred& caller);

  // --- device memory hooks (docs/gpu.md); call before serving ---
  // Features offered on top of shm::kFeaturesImplemented (kFeatureDeviceMemory
  // when the daemon runs a device engine).
  void EnableFeatures(uint64_t features) { extra_features_.store(features); }
  // Called with the session id after every session ended (device buffers
  // unmap there). Not called under the manager's lock.
  void AddSessionEndHook(std::function<void(uint64_t)> hook) ABSL_LOCKS_EXCLUDED(mu_);

  // The data connection's hello: checks the token and claims the session.
  absl::StatusOr<std::shared_ptr<Session>> ClaimSession(uint64_t session_id, const uint8_t* token,
                                                        const PeerCred& peer);

  // Registers the memfd tagged `fd_tag` on the session's data connection as
  // a buffer of `size_bytes`, then calls `done` with its id — once, possibly
  // before returning, possibly from another thread. Never blocks. fd_tag 0:
  // only checks that `size_bytes` fits the limits.
  using RegisterDone = std::function<void(absl::StatusOr<uint64_t>)>;
  void RegisterBuffer(uint64_t session_id, uint64_t fd_tag, uint64_t size_bytes,
                      const std::string& name, const PeerCred& caller, RegisterDone done);
  // Blocking form for tests and tools.
  absl::StatusOr<uint64_t> RegisterBufferSync(uint64_t session_id, uint64_t fd_tag,
                                              uint64_t size_bytes, const std::string& name,
                                              const PeerCred& caller);
  absl::Status FreeBuffer(uint64_t session_id, uint64_t buffer_id, const PeerCred& caller);
  // Creates or joins the k-th group of the caller's job with `ranks` (k
  // counted per session). With `rejoin_group_id` != 0, joins that existing
  // group again instead (after its epoch failed), and `ranks` must be its
  // ranks or empty.
  // `caller_gone` (optional) says whether the caller stopped waiting (its
  // RPC was cancelled): a placement wait in a cluster then ends at once, as
  // it does when the caller's session ends.
  absl::StatusOr<NewGroupResult> NewGroup(uint64_t session_id, const std::vector<int>& ranks,
                                          const PeerCred& caller, uint32_t rejoin_group_id = 0,
                                          std::function<bool()> caller_gone = nullptr);

  // nullptr when unknown.
  std::shared_ptr<Session> FindSession(uint64_t session_id) const;

  // Ends every session (daemon shutdown).
  void EndAll(const std::string& why);
  // Releases the arenas of ended groups once their members finished what was
  // committed there, waiting at most `bound` (the daemon is stopping).
  void ReleaseArenas(absl::Duration bound) { arena_reaper_->ReapAll(bound); }
  // hsdpctl drain: from now on Attach is refused (UNAVAILABLE, naming the
  // drain); sessions already attached go on. Thread-safe, one way.
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // Operations submitted and not yet completed, over every session.
  int64_t OpsInFlight() const;

  // Cluster: node `node` was lost; every group with members on it fails its
  // current epoch (Group::PeerLost; `old_instance`: it is back already with
  // a new daemon, see there). Thread-safe.
  void OnPeerLost(int node, const std::string& why, const std::string& old_instance = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Node `node` joined again: groups let its ranks into their next epoch.
  void OnPeerJoined(int node) ABSL_LOCKS_EXCLUDED(mu_);
  // Another daemon (node `origin`) reported that `epoch` of group `key`
  // failed, having completed its operations up to `completed_seq`: this
  // daemon's group of that key fails it too (Group::RemoteEpochFailed).
  void OnGroupEvent(const std::string& key, uint32_t epoch, int origin, const std::string& why,
                    uint64_t completed_seq = 0) ABSL_LOCKS_EXCLUDED(mu_);

  // Every job, or only those of `uid` when `only_uid` is set.
  std::vector<JobSummary> Jobs(std::optional<uint32_t> only_uid = std::nullopt) const;
  // Operations of sessions that already ended (live ones count their own).
  uint64_t retired_ops_completed() const { return retired_completed_.load(); }
  uint64_t retired_ops_failed() const { return retired_failed_.load(); }
  uint64_t bytes_registered() const;
  uint64_t max_node_bytes() const { return limits_.max_node_bytes; }
  uint64_t mappings() const;
  // Cross-node groups' engine state kept after their job ended here, not
  // yet destroyed (Housekeeping destroys it once it is due).
  uint64_t retired_groups() const;

  // SessionDirectory.
  uint64_t version() const override { return version_.load(std::memory_order_acquire); }
  std::vector<std::shared_ptr<Session>> Snapshot() const override;
  std::shared_ptr<Group> FindGroup(uint32_t group_id) const override;
  std::vector<std::shared_ptr<Group>> AllGroups() const override;
  void EndSession(uint64_t session_id, const std::string& why) override;
  void Housekeeping() override;

 private:
  // Attach to the job `choice` names, without the cluster step.
  absl::StatusOr<AttachResult> AttachHere(const AttachParams& params, const JobChoice& choice,
                                          const PeerCred& caller) ABSL_LOCKS_EXCLUDED(mu_);
  // Which job the Attach is for, and the checks that job makes of a new
  // member (world size, rank free).
  absl::StatusOr<JobChoice> ChooseJobLocked(const AttachParams& params, const PeerCred& caller)
      const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The class of service of a new member of job `key` that asks for
  // `requested` ("" = its own): an existing job's, or ChooseJobClass's.
  absl::StatusOr<ResolvedClass> ChooseClassLocked(const JobKey& key,
                                                  const std::string& requested) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckJoinLocked(const JobKey& key, const AttachParams& params) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates group `key` (the k-th with `ranks`) for session `s`, or returns
  // the one another member created meanwhile.
  absl::StatusOr<std::shared_ptr<Group>> CreateGroup(const std::shared_ptr<Session>& s,
                                                     const std::vector<int>& ranks,
                                                     const std::string& key, int k,
                                                     std::vector<int> nodes, int this_node,
                                                     uint32_t first_epoch)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time ClusterDeadline() const;

  // The session, checking that `caller` may act on it.
  absl::StatusOr<std::shared_ptr<Session>> Lookup(uint64_t session_id, const PeerCred& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Maps fd into a buffer for `s` and commits its reservation (or releases it).
  absl::StatusOr<uint64_t> FinishRegister(const std::shared_ptr<Session>& s,
                                          absl::StatusOr<UniqueFd> fd, uint64_t size_bytes,
                                          const std::string& name);
  // Gives back the node's share of one registration of `size_bytes` by `uid`.
  void ReleaseRegistration(uint32_t uid, uint64_t size_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes the job of `s` holds here: all its sessions, with their
  // registrations in progress (NodeLedger::CheckJobBytes).
  uint64_t JobBytesLocked(const Session& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunSessionEndHooks(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);

  const NodeConfig config_;
  const NodeLimits limits_;
  // What small-operation arenas may still take (data_plane.small_op_arena_mib).
  const std::shared_ptr<ArenaBudget> arena_budget_;
  // Ended groups' arenas until their members are done with them.
  const std::shared_ptr<ArenaReaper> arena_reaper_;
  Engine* const engine_;
  Executor* const control_;
  OpObserver* const observer_;
  ClusterDirectory* const cluster_;

  std::atomic<uint64_t> version_{0};
  std::atomic<bool> draining_{false};
  // NewGroup calls waiting for placement (thread-safe; used without mu_).
  PlacementWaits placement_waits_;
  std::atomic<uint64_t> extra_features_{0};
  std::vector<std::function<void(uint64_t)>> end_hooks_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> retired_completed_{0};
  std::atomic<uint64_t> retired_failed_{0};
  mutable absl::Mutex mu_;
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 0;  // from FirstSessionId(), up
  uint32_t next_group_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The node's bytes, mappings and group members, and the per-uid shares.
  NodeLedger ledger_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  // Cross-node groups of ended jobs whose engine state goes a little later.
  RetiredGroups retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_SESSION_MANAGER_H_
