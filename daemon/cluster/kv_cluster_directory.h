// ClusterDirectory over the cluster's key/value store (embedded or etcd) and
// this node's membership. Placement keys, for job J of owner uid U (JobKey::Encoded:
// the name length-prefixed, so any job id is unambiguous) and rank R:
//   hsdp/job/U/<len>:J/world    the job's world size (first writer wins)
//   hsdp/job/U/<len>:J/rank/R   the node rank hosting R (first writer wins)
//   hsdp/job/U/<len>:J/ranks    how many ranks are placed (the world key goes
//                               with the last one)
//   hsdp/epoch/<group key>    one past the last failed epoch of a group
//                             (written by the coordinator on Report)
// Withdrawals run on a worker thread (EndSession never waits on the
// network); Publish waits for queued withdrawals first, so a trainer that
// re-attaches at once is not un-placed by its predecessor's withdrawal.
//
// Thread-safe. Errors name the store.
#ifndef HSDP_DAEMON_CLUSTER_KV_CLUSTER_DIRECTORY_H_
#define HSDP_DAEMON_CLUSTER_KV_CLUSTER_DIRECTORY_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster_store.h"
#include "daemon/cluster/membership.h"
#include "daemon/jobs/cluster_directory.h"
#include "daemon/util/shortened_key.h"

namespace hsdp {

// Key helpers (shared with the coordinator's service and tests).
std::string JobPlacementPrefix(const JobKey& job);
std::string GroupEpochKey(const std::string& group_key);

class KvClusterDirectory : public ClusterDirectory {
 public:
  // `client` and `member` must outlive this; `nodes` is cluster.nodes.
  KvClusterDirectory(ClusterStore* client, Membership* member, int nodes);
  ~KvClusterDirectory() override;  // finishes queued withdrawals (bounded by their deadlines)

  int this_node() const override;
  absl::Status Publish(const JobKey& job, int rank, int world_size, absl::Time deadline,
                       bool join_only) override ABSL_LOCKS_EXCLUDED(mu_);
  void Withdraw(const JobKey& job, const std::vector<int>& ranks,
                absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<int>> Resolve(const JobKey& job, const std::vector<int>& ranks,
                                           absl::Time deadline,
                                           const std::function<bool()>& cancelled = nullptr) override;
  absl::StatusOr<uint32_t> FirstEpoch(const std::string& key, absl::Time deadline) override;
  void ReportEpochFailed(const std::string& key, uint32_t epoch, uint64_t completed_seq,
                         const std::string& why) override;

  static constexpr size_t kMaxQueued = 4096;

 private:
  absl::Status Named(const absl::Status& s, const std::string& what) const;
  void WithdrawNow(const JobKey& job, const std::vector<int>& ranks, absl::Time deadline);
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);

  ClusterStore* const client_;
  Membership* const member_;
  const int nodes_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_KV_CLUSTER_DIRECTORY_H_
