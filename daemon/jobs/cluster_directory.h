// What the session manager needs from the cluster (cluster.coordinator set):
// where every rank of a job is attached (placement), and a way to tell the
// other daemons that a cross-node group's epoch failed here. The real one
// (daemon/cluster/kv_cluster_directory.h) keeps placement in the
// coordinator's key/value store; tests use an in-memory fake shared by
// several "daemons".
//
// Placement keys are global: a JobKey (owner uid + job id) names the same
// job on every node of the cluster, so a job's ranks on every node run under
// its owner's uid (or were attached by root naming that owner); see
// docs/security.md, "Job identity", and docs/cluster.md, "Job ids across
// nodes".
//
// Implementations are thread-safe. Publish, Withdraw and Resolve may block
// on the network up to their deadline; callers hold no lock.
#ifndef HSDP_DAEMON_JOBS_CLUSTER_DIRECTORY_H_
#define HSDP_DAEMON_JOBS_CLUSTER_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/session/job_key.h"

namespace hsdp {

// Group epochs that cross the network (failure reports, the coordinator's
// epoch hints) are in [1, kMaxGroupEpoch). A group needs one epoch per
// failure, so the bound is never reached in practice; it keeps a corrupt or
// hostile value from wrapping a daemon's 32-bit epoch counter.
inline constexpr uint32_t kMaxGroupEpoch = 1u << 30;

class ClusterDirectory {
 public:
  virtual ~ClusterDirectory() = default;

  // This daemon's node rank.
  virtual int this_node() const = 0;

  // Records that `rank` of `job` (of `world_size`) is attached on this node.
  // INVALID_ARGUMENT when the job has another world size elsewhere in the
  // cluster; ALREADY_EXISTS when the rank is attached on another node;
  // with `join_only`, NOT_FOUND when the job has no rank placed anywhere
  // (root joining another user's job never creates it); UNAVAILABLE /
  // DEADLINE_EXCEEDED naming the coordinator when it cannot be reached by
  // `deadline`.
  virtual absl::Status Publish(const JobKey& job, int rank, int world_size, absl::Time deadline,
                               bool join_only) = 0;
  // `ranks` of `job` left this node. Never blocks; best effort (logs what
  // fails).
  virtual void Withdraw(const JobKey& job, const std::vector<int>& ranks,
                        absl::Time deadline) = 0;
  // The node of each of `ranks`, waiting until every one is placed or
  // `deadline` (DEADLINE_EXCEEDED naming how many ranks were not attached
  // anywhere). `cancelled` (optional) is asked at least every
  // kResolveCancelCheck while waiting: once true, the wait ends CANCELLED
  // (the caller went away; its wait must not hold a thread to the deadline).
  static constexpr absl::Duration kResolveCancelCheck = absl::Milliseconds(100);
  virtual absl::StatusOr<std::vector<int>> Resolve(
      const JobKey& job, const std::vector<int>& ranks, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr) = 0;

  // The epoch a new group `key` starts in on this daemon: 1, or one past the
  // last epoch of it that failed anywhere (so a group re-created on a node
  // whose trainers all restarted lines up with the others).
  virtual absl::StatusOr<uint32_t> FirstEpoch(const std::string& key, absl::Time deadline) = 0;

  // Epoch `epoch` of cross-node group `key` failed here for `why`: the
  // other daemons fail it too. Never blocks.
  virtual void ReportEpochFailed(const std::string& key, uint32_t epoch, uint64_t completed_seq,
                                 const std::string& why) = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_CLUSTER_DIRECTORY_H_
