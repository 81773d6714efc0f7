// The jobs attached to this daemon, keyed by JobKey (owner uid + name), and
// the one rule that decides which job an Attach is for (docs/security.md,
// "Job identity"):
//
//   - An Attach that names no owner, or names the caller's own uid, is for
//     the caller's own job of that name. Any allowed uid; another user's job
//     of the same name is a different job and is never looked at, so nothing
//     about it can be learned, taken or blocked.
//   - Naming another uid as the owner is for root and the daemon's uid only
//     (PERMISSION_DENIED otherwise, before anything is looked up). The job
//     must exist: attached here, or — in a cluster — placed on another node
//     (the cluster directory checks that); NOT_FOUND otherwise.
//   - Root or the daemon's uid naming no owner, where the name exists here
//     only under other uids: FAILED_PRECONDITION naming the owners, so an
//     operator never starts a separate job by accident when they meant to
//     join one.
//
// Not thread-safe: the SessionManager guards it with its lock.
#ifndef HSDP_DAEMON_JOBS_JOB_TABLE_H_
#define HSDP_DAEMON_JOBS_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/session/job_key.h"
#include "daemon/session/session.h"

namespace hsdp {

struct Job {
  int world_size = 0;
  std::map<int, uint64_t> rank_to_session;
  // GroupKey(job, ranks, k) -> group id: the k-th NewGroup call with `ranks`.
  std::map<std::string, uint32_t> groups;
  // (session id, ranks) -> calls so far. Only accepted calls are counted.
  std::map<std::pair<uint64_t, std::vector<int>>, int> calls;
  uint64_t group_members = 0;  // sum of the sizes of its groups
  // Operations in flight of its sessions here, shared with each of them.
  std::shared_ptr<JobOpCount> ops;
  // Its class of service, chosen when its first member attached.
  std::string priority_class;
  uint32_t priority_level = 4;
};

struct JobSummary {
  std::string job_id;
  int world_size = 0;
  int attached = 0;
  uint32_t groups = 0;
  uint32_t owner_uid = 0;
  std::string priority_class;
  uint32_t priority_level = 0;
};

// Who attaches, and whose job they name.
struct AttachIdentity {
  uint32_t caller_uid = 0;
  bool caller_is_admin = false;       // root or the daemon's uid
  std::optional<uint32_t> owner_uid;  // AttachRequest.owner_uid, when set
};

// The job an Attach is for.
struct JobChoice {
  JobKey key;
  // Another uid's job, named by an admin: it must already exist (here, or
  // placed elsewhere in the cluster); an Attach never creates it.
  bool join_only = false;
};

class JobTable {
 public:
  // Which job an Attach of `name` by `who` is for (the rule above).
  // `cluster`: the job may exist on another node only (join_only choices
  // are then checked by the cluster directory instead of here).
  absl::StatusOr<JobChoice> Choose(const std::string& name, const AttachIdentity& who,
                                   bool cluster) const;
  // The checks an existing job makes of a new member: the same world size,
  // the rank free (`describe` names the session holding it). OK when the
  // job does not exist here yet.
  absl::Status CheckJoin(const JobKey& key, int rank, int world_size,
                         const std::function<std::string(uint64_t)>& describe) const;

  Job* Find(const JobKey& key);
  const Job* Find(const JobKey& key) const;
  Job& FindOrAdd(const JobKey& key) { return jobs_[key]; }
  void Erase(const JobKey& key) { jobs_.erase(key); }
  size_t size() const { return jobs_.size(); }

  // Every job, or only those owned by `only_uid`.
  std::vector<JobSummary> Summaries(std::optional<uint32_t> only_uid) const;

 private:
  std::map<JobKey, Job> jobs_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_JOB_TABLE_H_
