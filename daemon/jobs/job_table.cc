#include "daemon/jobs/job_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsdp {
namespace {

constexpr size_t kMaxNamedOwners = 8;  // in the FAILED_PRECONDITION message

}  // namespace

absl::StatusOr<JobChoice> JobTable::Choose(const std::string& name, const AttachIdentity& who,
                                           bool cluster) const {
  const uint32_t owner = who.owner_uid.value_or(who.caller_uid);
  JobChoice choice{JobKey{owner, name}, false};
  if (owner != who.caller_uid) {
    // Decided before anything is looked up: a non-admin learns nothing.
    if (!who.caller_is_admin) {
      return absl::PermissionDeniedError(absl::StrCat(
          "owner_uid: only root and the daemon's uid may join another user's job (uid ",
          who.caller_uid, " named uid ", owner,
          "); leave owner_uid unset to attach to your own "
          "job \"",
          name, "\""));
    }
    choice.join_only = true;
    if (!cluster && Find(choice.key) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("owner_uid: uid ", owner, " has no job \"", name,
                       "\" on this node; check owner_uid "
                       "and job_id (root joins another user's job only if it exists)"));
    }
    return choice;
  }
  if (who.caller_is_admin && !who.owner_uid.has_value() && Find(choice.key) == nullptr) {
    // An operator who meant to join a user's job and forgot the owner would
    // otherwise start a separate job of their own and wait for ranks that
    // never come. An operator's own job that a user's job of the same name
    // must not block names its own uid as owner (then this is skipped).
    std::vector<uint32_t> others;
    for (const auto& [key, job] : jobs_) {  // at most limits.max_sessions jobs
      if (key.name == name) others.push_back(key.owner_uid);
    }
    if (!others.empty()) {
      if (others.size() > kMaxNamedOwners) others.resize(kMaxNamedOwners);
      return absl::FailedPreconditionError(absl::StrCat(
          "owner_uid: job \"", name, "\" exists on this node only under uid ",
          absl::StrJoin(others, ", uid "), ", not under the caller's uid ", who.caller_uid,
          "; set owner_uid to join it, or set owner_uid to ", who.caller_uid,
          " to start a job of your own under that name"));
    }
  }
  return choice;
}

absl::Status JobTable::CheckJoin(const JobKey& key, int rank, int world_size,
                                 const std::function<std::string(uint64_t)>& describe) const {
  const Job* job = Find(key);
  if (job == nullptr) return absl::OkStatus();
  if (job->world_size != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", key.Describe(),
                                                   " has world size ", job->world_size,
                                                   ", this trainer says ", world_size));
  }
  if (auto r = job->rank_to_session.find(rank); r != job->rank_to_session.end()) {
    return absl::AlreadyExistsError(absl::StrCat("rank: rank ", rank, " of ", key.Describe(),
                                                 " is already attached (", describe(r->second),
                                                 ")"));
  }
  return absl::OkStatus();
}

Job* JobTable::Find(const JobKey& key) {
  auto it = jobs_.find(key);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Job* JobTable::Find(const JobKey& key) const {
  auto it = jobs_.find(key);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<JobSummary> JobTable::Summaries(std::optional<uint32_t> only_uid) const {
  std::vector<JobSummary> out;
  for (const auto& [key, job] : jobs_) {
    if (only_uid.has_value() && key.owner_uid != *only_uid) continue;
    out.push_back(JobSummary{key.name, job.world_size, static_cast<int>(job.rank_to_session.size()),
                             static_cast<uint32_t>(job.groups.size()), key.owner_uid,
                             job.priority_class, job.priority_level});
  }
  return out;
}

}  // namespace hsdp
