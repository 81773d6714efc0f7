// The node's resource ledger: what every session, buffer and group on this
// node holds of the node-wide limits — registered bytes, shared-memory
// mappings (below vm.max_map_count) and group members — and the per-uid
// shares of sessions, bytes and members (limits.uid_share_percent, root
// exempt; UidSharedPool). It answers "may this uid / job take X of the node",
// reserves it, and takes it back.
//
// Reserve-then-commit: a Reserve* checks and counts in one call (a
// registration in progress is counted, so two racing ones cannot both pass);
// the caller either keeps what it reserved (nothing more to do) or gives it
// back with the matching Release* when the work fails. Every Reserve* that
// succeeded is paired with exactly one Release* of the same uid and amount,
// at failure or when the session / buffer / group goes.
//
// Who is charged: sessions and registered bytes to the session's uid, group
// members to the job's owner (the caller passes the uid).
//
// Thread-safety: not thread-safe. Its owner serializes every call
// (SessionManager holds its mu_; the ledger is ABSL_GUARDED_BY it there). The
// UidSharedPools inside have leaf locks of their own.
#ifndef HSDP_DAEMON_JOBS_NODE_LEDGER_H_
#define HSDP_DAEMON_JOBS_NODE_LEDGER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "daemon/session/job_key.h"
#include "daemon/util/uid_share.h"

namespace hsdp {

// Node-wide bounds derived from the configuration and the kernel.
struct NodeLimits {
  uint64_t max_node_bytes = 0;     // registered buffer bytes
  uint64_t max_mappings = 0;       // buffers + channels mapped (below vm.max_map_count)
  uint64_t max_group_members_per_job = 1 << 20;  // sum of group sizes
  uint64_t max_group_members = 1 << 21;          // node-wide sum of group sizes
};

// The mapping budget for `vm.max_map_count` = `kernel_limit`: three quarters,
// leaving room for the daemon's own libraries, stacks and heap.
uint64_t MappingBudget(uint64_t kernel_limit);
// Reads /proc/sys/vm/max_map_count (65530 when unreadable).
uint64_t KernelMaxMapCount();

// "N bytes (M MiB)": how refusals name an amount of memory.
std::string FormatBytes(uint64_t bytes);

class NodeLedger {
 public:
  // `max_sessions` (limits.max_sessions) bounds the sessions' share pool;
  // `max_job_bytes` (limits.max_job_bytes, 0 = none) a job's registered
  // bytes; `uid_share_percent` (1..100) every per-uid share.
  NodeLedger(const NodeLimits& limits, uint64_t max_sessions, uint64_t max_job_bytes,
             uint32_t uid_share_percent);
  NodeLedger(const NodeLedger&) = delete;
  NodeLedger& operator=(const NodeLedger&) = delete;

  // --- sessions: one session of `uid` and its channel's mapping ---
  // RESOURCE_EXHAUSTED when the mapping budget is spent or `uid` holds its
  // share of limits.max_sessions (the node's session count itself is the
  // owner's to check: it knows its sessions).
  absl::Status ReserveSession(uint32_t uid);
  void ReleaseSession(uint32_t uid);

  // --- buffers: `size_bytes` registered by a session of `uid`, one mapping ---
  // RESOURCE_EXHAUSTED when `size_bytes` more would take the node over
  // max_node_bytes, or the mapping budget is spent. Reserves nothing.
  absl::Status CheckBufferFits(uint64_t size_bytes) const;
  // RESOURCE_EXHAUSTED naming `job` when `size_bytes` more than the
  // `job_used_bytes` it holds here (its registrations in progress included)
  // would take it over max_job_bytes. Reserves nothing.
  absl::Status CheckJobBytes(const JobKey& job, uint64_t job_used_bytes,
                             uint64_t size_bytes) const;
  // Charges `size_bytes` to `uid`'s share (RESOURCE_EXHAUSTED when over it)
  // and counts the bytes and one mapping on the node. Does not repeat
  // CheckBufferFits.
  absl::Status ReserveBuffer(uint32_t uid, uint64_t size_bytes);
  // Gives back `count` buffers of `bytes` in all, of a session of `uid`
  // (a failed registration: 1 buffer; a session that ended: all of its).
  void ReleaseBuffers(uint32_t uid, uint64_t count, uint64_t bytes);

  // --- group members: a group of `n` ranks of a job, charged to its owner ---
  // RESOURCE_EXHAUSTED naming `job` when `n` more would take it (holding
  // `job_members`) over max_group_members_per_job or the node over
  // max_group_members. Reserves nothing.
  absl::Status CheckMembers(const JobKey& job, uint64_t job_members, uint64_t n) const;
  // Charges `n` to `owner_uid`'s share (RESOURCE_EXHAUSTED when over it) and
  // counts them on the node. Does not repeat CheckMembers.
  absl::Status ReserveMembers(uint32_t owner_uid, uint64_t n);
  void ReleaseMembers(uint32_t owner_uid, uint64_t n);

  const NodeLimits& limits() const { return limits_; }
  uint64_t bytes() const { return node_bytes_; }  // registrations in progress included
  uint64_t mappings() const { return node_mappings_; }  // buffers and channels
  uint64_t group_members() const { return node_group_members_; }
  const UidSharedPool& sessions_share() const { return sessions_share_; }
  const UidSharedPool& bytes_share() const { return bytes_share_; }
  const UidSharedPool& members_share() const { return members_share_; }

 private:
  absl::Status CheckMapping() const;

  const NodeLimits limits_;
  const uint64_t max_job_bytes_;
  uint64_t node_bytes_ = 0;
  uint64_t node_mappings_ = 0;
  uint64_t node_group_members_ = 0;
  UidSharedPool sessions_share_;
  UidSharedPool bytes_share_;
  UidSharedPool members_share_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_NODE_LEDGER_H_
