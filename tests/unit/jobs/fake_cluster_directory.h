// An in-memory ClusterDirectory for tests: several simulated daemons share
// one FakeClusterState (the coordinator's placement and epoch hints); each
// has its own FakeClusterDirectory (its node rank). Reported epoch failures
// queue in the state until the test delivers them to the other daemons'
// SessionManagers (as heartbeats would). Counts the calls, so tests can check
// that hostile input never reached the "network".
#ifndef HSDP_TESTS_UNIT_SESSION_FAKE_CLUSTER_DIRECTORY_H_
#define HSDP_TESTS_UNIT_SESSION_FAKE_CLUSTER_DIRECTORY_H_

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/jobs/cluster_directory.h"
#include "daemon/jobs/session_manager.h"

namespace hsdp::testing {

struct FakeClusterState {
  struct Event {
    int origin;
    std::string key;
    uint32_t epoch;
    std::string why;
    uint64_t completed_seq = 0;
  };
  absl::Mutex mu;
  std::map<std::pair<JobKey, int>, int> rank_node;  // (job, rank) -> node
  std::map<JobKey, int> world;
  std::map<std::string, uint32_t> first_epoch;  // group key -> next epoch
  std::vector<Event> events;
  std::map<int, SessionManager*> managers;  // by node
  int network_calls = 0;
  bool hold_resolve = false;  // Resolve waits for release instead of its deadline
  int resolving = 0;          // Resolve calls in progress

  // Hands every queued event to the other nodes' managers; returns how many.
  int Deliver() {
    std::vector<Event> evs;
    std::map<int, SessionManager*> ms;
    {
      absl::MutexLock l(&mu);
      evs.swap(events);
      ms = managers;
    }
    for (const Event& e : evs) {
      for (auto& [node, sm] : ms) {
        if (node != e.origin) sm->OnGroupEvent(e.key, e.epoch, e.origin, e.why, e.completed_seq);
      }
    }
    return static_cast<int>(evs.size());
  }
};

class FakeClusterDirectory : public ClusterDirectory {
 public:
  FakeClusterDirectory(FakeClusterState* state, int node) : state_(state), node_(node) {}

  int this_node() const override { return node_; }

  absl::Status Publish(const JobKey& job, int rank, int world_size, absl::Time,
                       bool join_only) override {
    absl::MutexLock l(&state_->mu);
    ++state_->network_calls;
    if (join_only && state_->world.count(job) == 0) {
      return absl::NotFoundError(absl::StrCat("owner_uid: uid ", job.owner_uid, " has no job \"",
                                              job.name, "\" on any node of the cluster"));
    }
    auto [w, fresh] = state_->world.emplace(job, world_size);
    if (w->second != world_size) {
      return absl::InvalidArgumentError(absl::StrCat("world_size: ", job.Describe(),
                                                     " has world size ", w->second,
                                                     " on another node"));
    }
    auto [it, placed] = state_->rank_node.emplace(std::make_pair(job, rank), node_);
    if (it->second != node_) {
      return absl::AlreadyExistsError(absl::StrCat("rank: rank ", rank, " of ", job.Describe(),
                                                   " is already attached on node ",
                                                   it->second));
    }
    return absl::OkStatus();
  }

  void Withdraw(const JobKey& job, const std::vector<int>& ranks, absl::Time) override {
    absl::MutexLock l(&state_->mu);
    for (int r : ranks) state_->rank_node.erase({job, r});
  }

  absl::StatusOr<std::vector<int>> Resolve(const JobKey& job, const std::vector<int>& ranks,
                                           absl::Time deadline,
                                           const std::function<bool()>& cancelled = nullptr) override {
    absl::MutexLock l(&state_->mu);
    ++state_->network_calls;
    auto placed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      for (int r : ranks) {
        if (!state_->rank_node.count({job, r})) return false;
      }
      return true;
    };
    ++state_->resolving;
    if (state_->hold_resolve) {
      auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
        return !state_->hold_resolve;
      };
      state_->mu.Await(absl::Condition(&released));
    }
    // As the real one: in slices, asking `cancelled` between them.
    bool ok = false;
    for (;;) {
      if (cancelled != nullptr && cancelled()) {
        --state_->resolving;
        return absl::CancelledError("resolving ranks: the caller went away");
      }
      const absl::Time slice_end =
          cancelled == nullptr ? deadline
                               : std::min(deadline, absl::Now() + kResolveCancelCheck);
      ok = state_->mu.AwaitWithDeadline(absl::Condition(&placed), slice_end);
      if (ok || absl::Now() >= deadline) break;
    }
    --state_->resolving;
    if (!ok) return absl::DeadlineExceededError("ranks: not every rank attached in time");
    std::vector<int> nodes;
    for (int r : ranks) nodes.push_back(state_->rank_node.at({job, r}));
    return nodes;
  }

  absl::StatusOr<uint32_t> FirstEpoch(const std::string& key, absl::Time) override {
    absl::MutexLock l(&state_->mu);
    ++state_->network_calls;
    auto it = state_->first_epoch.find(key);
    return it == state_->first_epoch.end() ? 1u : it->second;
  }

  void ReportEpochFailed(const std::string& key, uint32_t epoch, uint64_t completed_seq,
                         const std::string& why) override {
    absl::MutexLock l(&state_->mu);
    state_->events.push_back({node_, key, epoch, why, completed_seq});
    uint32_t& next = state_->first_epoch[key];
    next = std::max(next, epoch + 1);
  }

 private:
  FakeClusterState* const state_;
  const int node_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_UNIT_SESSION_FAKE_CLUSTER_DIRECTORY_H_
