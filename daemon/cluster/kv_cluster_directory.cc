#include "daemon/cluster/kv_cluster_directory.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

constexpr size_t kKeysPerWait = 1024;  // KvLimits::max_wait_keys
constexpr size_t kMaxNamedMissing = 8;

std::string WorldKey(const JobKey& job) { return JobPlacementPrefix(job) + "world"; }
std::string CountKey(const JobKey& job) { return JobPlacementPrefix(job) + "ranks"; }
std::string RankKey(const JobKey& job, int rank) {
  return absl::StrCat(JobPlacementPrefix(job), "rank/", rank);
}

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

}  // namespace

std::string JobPlacementPrefix(const JobKey& job) {
  return absl::StrCat("hsdp/job/", job.Encoded(), "/");
}

std::string GroupEpochKey(const std::string& group_key) {
  return absl::StrCat("hsdp/epoch/", group_key);
}

KvClusterDirectory::KvClusterDirectory(ClusterStore* client, Membership* member, int nodes)
    : client_(client), member_(member), nodes_(nodes) {
  worker_ = std::thread([this] { Worker(); });
}

KvClusterDirectory::~KvClusterDirectory() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  worker_.join();
}

int KvClusterDirectory::this_node() const { return member_->node_rank(); }

absl::Status KvClusterDirectory::Named(const absl::Status& s, const std::string& what) const {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", client_->name(), " failed (", s.message(),
                                             "); see docs/cluster.md, losing the store"));
}

void KvClusterDirectory::Worker() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock l(&mu_);
      busy_ = false;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    work();
  }
}

absl::Status KvClusterDirectory::Publish(const JobKey& job, int rank, int world_size,
                                         absl::Time deadline, bool join_only) {
  {
    // A withdrawal of this rank still queued must not run after this claim.
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, " of ", job.Describe(), ": earlier withdrawals from ",
          client_->name(), " did not finish in time"));
    }
  }
  const std::string what = absl::StrCat("placing rank ", rank, " of ", job.Describe());
  if (join_only) {
    // Root joining another user's job: only one that has ranks placed.
    absl::StatusOr<std::string> placed = client_->Get(WorldKey(job), Left(deadline));
    if (placed.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          "owner_uid: uid ", job.owner_uid, " has no job \"", job.name, "\" on any node of the "
          "cluster; check owner_uid and job_id (root joins another user's job only if it "
          "exists)"));
    }
    if (!placed.ok()) return Named(placed.status(), what);
  }
  absl::StatusOr<std::string> world =
      client_->SetIfAbsent(WorldKey(job), absl::StrCat(world_size), Left(deadline));
  if (!world.ok()) return Named(world.status(), what);
  if (*world != absl::StrCat(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", job.Describe(), " has world size ", *world,
        " on another node of the cluster, this trainer says ", world_size));
  }
  const std::string me = absl::StrCat(this_node());
  absl::StatusOr<std::string> node = client_->SetIfAbsent(RankKey(job, rank), me, Left(deadline));
  if (!node.ok()) return Named(node.status(), what);
  if (*node != me) {
    return absl::AlreadyExistsError(absl::StrCat("rank: rank ", rank, " of ", job.Describe(),
                                                 " is already attached on node ", *node,
                                                 " of the cluster (this is node ", me, ")"));
  }
  if (absl::StatusOr<int64_t> n = client_->Add(CountKey(job), 1, Left(deadline)); !n.ok()) {
    return Named(n.status(), what);
  }
  return absl::OkStatus();
}

void KvClusterDirectory::WithdrawNow(const JobKey& job, const std::vector<int>& ranks,
                                     absl::Time deadline) {
  // Small calls: never hold a shutdown up for long on a silent coordinator.
  deadline = std::min(deadline, absl::Now() + absl::Seconds(2));
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(RankKey(job, r));
  for (size_t i = 0; i < keys.size(); i += kKeysPerWait) {
    std::vector<std::string> chunk(keys.begin() + i,
                                   keys.begin() + std::min(keys.size(), i + kKeysPerWait));
    if (absl::Status s = client_->Delete(chunk, Left(deadline)); !s.ok()) {
      HSDP_LOG(Warning) << "cluster: cannot withdraw ranks of " << job.Describe()
                        << " from the coordinator: " << s.message();
      return;
    }
  }
  absl::StatusOr<int64_t> left =
      client_->Add(CountKey(job), -static_cast<int64_t>(ranks.size()), Left(deadline));
  if (left.ok() && *left <= 0) {
    // The job has no rank left anywhere: its id (and world size) is free again.
    (void)client_->Delete({WorldKey(job), CountKey(job)}, Left(deadline));
  }
}

void KvClusterDirectory::Withdraw(const JobKey& job, const std::vector<int>& ranks,
                                  absl::Time deadline) {
  if (ranks.empty()) return;
  absl::MutexLock l(&mu_);
  if (queue_.size() >= kMaxQueued) {
    HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: too many queued withdrawals; ranks of "
                                     << job.Describe() << " stay placed on this node";
    return;
  }
  queue_.push_back([this, job, ranks, deadline] { WithdrawNow(job, ranks, deadline); });
}

absl::StatusOr<std::vector<int>> KvClusterDirectory::Resolve(const JobKey& job,
                                                             const std::vector<int>& ranks,
                                                             absl::Time deadline,
                                                             const std::function<bool()>& cancelled) {
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); i += kKeysPerWait) {
    std::vector<std::string> keys;
    for (size_t j = i; j < std::min(ranks.size(), i + kKeysPerWait); ++j) {
      keys.push_back(RankKey(job, ranks[j]));
    }
    // Waits in slices so that a caller that went away frees its thread.
    absl::StatusOr<std::vector<std::string>> values;
    for (;;) {
      if (cancelled != nullptr && cancelled()) {
        return absl::CancelledError(absl::StrCat("resolving ranks of ", job.Describe(),
                                                 ": the caller went away"));
      }
      const absl::Time slice_end =
          cancelled == nullptr ? deadline : std::min(deadline, absl::Now() + kResolveCancelCheck);
      values = client_->WaitValues(keys, Left(slice_end));
      if (values.status().code() != absl::StatusCode::kDeadlineExceeded ||
          absl::Now() >= deadline) {
        break;
      }
    }
    if (values.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // Name a few of the ranks nobody placed.
      std::vector<std::string> missing;
      for (size_t j = 0; j < keys.size() && missing.size() < kMaxNamedMissing; ++j) {
        const absl::Status got = client_->Get(keys[j], absl::Seconds(1)).status();
        if (got.code() == absl::StatusCode::kNotFound) {
          missing.push_back(absl::StrCat(ranks[i + j]));
        } else if (!got.ok()) {
          // The store itself is failing: say so rather than blame the ranks.
          return Named(got, absl::StrCat("resolving ranks of ", job.Describe()));
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ranks: rank(s) ", missing.empty() ? "?" : absl::StrJoin(missing, ", "),
          missing.size() == kMaxNamedMissing ? ", ..." : "", " of ", job.Describe(),
          " did not attach to any daemon of the cluster in time (every rank of a group must "
          "attach to its node's hsdpd before the group is created)"));
    }
    if (!values.ok()) {
      return Named(values.status(), absl::StrCat("resolving ranks of ", job.Describe()));
    }
    for (const std::string& v : *values) {
      int node = -1;
      if (!absl::SimpleAtoi(v, &node) || node < 0 || node >= nodes_) {
        return absl::InternalError(absl::StrCat(client_->name(),
                                                " holds an invalid node \"", v.substr(0, 32),
                                                "\" for a rank of ", job.Describe()));
      }
      nodes.push_back(node);
    }
  }
  return nodes;
}

absl::StatusOr<uint32_t> KvClusterDirectory::FirstEpoch(const std::string& key,
                                                        absl::Time deadline) {
  absl::StatusOr<std::string> v = client_->Get(GroupEpochKey(key), Left(deadline));
  if (v.status().code() == absl::StatusCode::kNotFound ||
      v.status().code() == absl::StatusCode::kInvalidArgument) {  // key too long: never written
    return 1u;
  }
  if (!v.ok()) return Named(v.status(), "looking up a group's epoch");
  uint32_t epoch = 0;
  if (!absl::SimpleAtoi(*v, &epoch) || epoch < 1 || epoch > kMaxGroupEpoch) {
    // Only a peer that wrote the key by hand gets here: refuse rather than
    // start an epoch the other daemons do not share (or one that wraps).
    return absl::InternalError(absl::StrCat(client_->name(),
                                            " holds an invalid epoch \"", v->substr(0, 32),
                                            "\" for group ", key.substr(0, 64)));
  }
  return epoch;
}

void KvClusterDirectory::ReportEpochFailed(const std::string& key, uint32_t epoch,
                                           uint64_t completed_seq, const std::string& why) {
  v1::GroupEvent e;
  e.set_group_key(key);
  e.set_epoch(epoch);
  e.set_completed_seq(completed_seq);
  e.set_why(why.substr(0, 1000));
  member_->ReportGroupEvent(std::move(e));
}

}  // namespace hsdp
