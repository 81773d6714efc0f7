// SessionManager: a job's groups. NewGroup creates or joins the k-th group of
// the caller's job with some ranks, or joins an existing one again after its
// epoch failed; in a cluster it first resolves the node of every rank (a
// bounded number of calls wait, without the lock) and the epoch a cross-node
// group starts in. CreateGroup checks the job's and the node's group limits and
// creates the Group and its engine group. Also the groups looked up, and the
// cluster's events (a peer node lost or joined, an epoch failed on another
// node) passed on to them. The rest of SessionManager: session_manager.h lists
// its files.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/jobs/session_manager.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {

absl::StatusOr<NewGroupResult> SessionManager::NewGroup(uint64_t session_id,
                                                        const std::vector<int>& ranks,
                                                        const PeerCred& caller,
                                                        uint32_t rejoin_group_id,
                                                        std::function<bool()> caller_gone) {
  std::shared_ptr<Group> group;
  std::shared_ptr<Session> s;
  std::string key;
  int k = 0;
  bool all_here = false;  // every rank attached to this daemon: no placement lookup
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(s, Lookup(session_id, caller));
    Job& job = *jobs_.Find(s->info().job());  // a live session's job exists
    if (rejoin_group_id != 0) {
      auto it = groups_.find(rejoin_group_id);
      if (it == groups_.end() || it->second->job() != s->info().job()) {
        return absl::NotFoundError(absl::StrCat("rejoin_group_id: ", s->info().job().Describe(),
                                                " has no group ", rejoin_group_id));
      }
      if (!ranks.empty() && ranks != it->second->ranks()) {
        return absl::InvalidArgumentError(absl::StrCat("ranks: group ", rejoin_group_id,
                                                       " has other ranks; pass its ranks or none"));
      }
      group = it->second;
    } else {
      if (ranks.empty()) return absl::InvalidArgumentError("ranks: must not be empty");
      if (ranks.size() > static_cast<size_t>(job.world_size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks: ", ranks.size(), " ranks in a job of world size ", job.world_size));
      }
      bool has_caller = false;
      {
        std::vector<bool> seen(job.world_size, false);  // bounded by the job's world size
        for (size_t i = 0; i < ranks.size(); ++i) {
          if (ranks[i] < 0 || ranks[i] >= job.world_size) {
            return absl::InvalidArgumentError(absl::StrCat(
                "ranks[", i, "]: ", ranks[i], " is outside [0, world_size=", job.world_size, ")"));
          }
          if (seen[ranks[i]]) {
            return absl::InvalidArgumentError(
                absl::StrCat("ranks[", i, "]: rank ", ranks[i], " appears twice"));
          }
          seen[ranks[i]] = true;
          if (ranks[i] == s->info().rank) has_caller = true;
        }
      }
      if (!has_caller) {
        return absl::InvalidArgumentError(absl::StrCat("ranks: the caller's rank ", s->info().rank,
                                                       " is not in the list of ", ranks.size(),
                                                       " ranks; only members call NewGroup"));
      }
      auto call_it = job.calls.find({session_id, ranks});
      k = call_it == job.calls.end() ? 0 : call_it->second;
      key = GroupKey(s->info().job(), ranks, k);
      auto it = job.groups.find(key);
      if (it != job.groups.end()) {
        group = groups_.at(it->second);
        job.calls[{session_id, ranks}] = k + 1;  // counted only once accepted
      } else if (job.groups.size() >= config_.max_groups_per_job) {
        // Checked again when creating; early here, before any network wait.
        return absl::ResourceExhaustedError(absl::StrCat(s->info().job().Describe(),
                                                         " already has ", job.groups.size(),
                                                         " groups (limits.max_groups_per_job)"));
      }
      all_here = std::all_of(ranks.begin(), ranks.end(),
                             [&](int r) { return job.rank_to_session.count(r) > 0; });
    }
  }
  if (group == nullptr) {
    // Where every rank is (a network wait in a cluster; no lock held).
    std::vector<int> nodes;
    int this_node = 0;
    uint32_t first_epoch = 1;
    if (cluster_ != nullptr && all_here) {
      this_node = cluster_->this_node();
    } else if (cluster_ != nullptr) {
      // Each wait holds a gRPC thread: bounded, so waiting groups cannot
      // take every thread of the daemon, and shared per uid, so one user's
      // waits cannot refuse everyone else's groups. A wait ends when its
      // caller goes (cancelled call, ended session).
      ASSIGN_OR_RETURN(PlacementWaits::Slot wait, placement_waits_.Enter(caller.uid));
      const absl::Time deadline = ClusterDeadline();
      auto gone = [&s, &caller_gone] {
        return s->closed() || (caller_gone != nullptr && caller_gone());
      };
      absl::StatusOr<std::vector<int>> resolved =
          cluster_->Resolve(s->info().job(), ranks, deadline, gone);
      wait.Leave();
      ASSIGN_OR_RETURN(nodes, std::move(resolved));
      this_node = cluster_->this_node();
      if (std::all_of(nodes.begin(), nodes.end(), [&](int n) { return n == this_node; })) {
        nodes.clear();  // all here: a single-node group, as without a cluster
      } else {
        ASSIGN_OR_RETURN(first_epoch, cluster_->FirstEpoch(key, deadline));
      }
    }
    ASSIGN_OR_RETURN(group,
                     CreateGroup(s, ranks, key, k, std::move(nodes), this_node, first_epoch));
  }
  const int group_rank = group->RankOf(s->info().rank);
  if (group_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rejoin_group_id: rank ", s->info().rank,
                                                   " is not a member of group ", group->id()));
  }
  ASSIGN_OR_RETURN(const uint32_t epoch, group->Join(group_rank, s));
  NewGroupResult result{group->id(), group_rank, group->size(), epoch, group->ArenaFor(epoch)};
  if (result.arena != nullptr && (s->info().features & shm::kFeatureSmallOpArena) == 0) {
    // Its peers run small operations in the arena; this client would send
    // them to the daemon, and neither side would ever match.
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group->id(), " runs small operations in a shared arena, which this client "
        "did not offer at Attach (an older client library?); use the library the other members "
        "use"));
  }
  return result;
}

absl::StatusOr<std::shared_ptr<Group>> SessionManager::CreateGroup(
    const std::shared_ptr<Session>& s, const std::vector<int>& ranks, const std::string& key, int k,
    std::vector<int> nodes, int this_node, uint32_t first_epoch) {
  absl::MutexLock l(&mu_);
  Job* job_ptr = jobs_.Find(s->info().job());
  if (s->closed() || job_ptr == nullptr) {
    return absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  Job& job = *job_ptr;
  std::shared_ptr<Group> group;
  if (auto it = job.groups.find(key); it != job.groups.end()) {
    group = groups_.at(it->second);  // another member created it meanwhile
  } else {
    if (job.groups.size() >= config_.max_groups_per_job) {
      return absl::ResourceExhaustedError(absl::StrCat(s->info().job().Describe(), " already has ",
                                                       job.groups.size(),
                                                       " groups (limits.max_groups_per_job)"));
    }
    RETURN_IF_ERROR(ledger_.CheckMembers(s->info().job(), job.group_members, ranks.size()));
    if (!nodes.empty() && !engine_->SupportsRemoteMembers()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ranks: the group spans nodes, but this hsdpd's engine (", engine_->name(),
                       ") cannot reach other nodes (built without the cross-node engine?)"));
    }
    // Reserved now; given back if the engine refuses the group.
    RETURN_IF_ERROR(ledger_.ReserveMembers(s->info().owner_uid, ranks.size()));
    const uint32_t id = next_group_id_++;
    GroupSpec spec;
    spec.id = id;
    spec.key = key;
    spec.job_id = s->info().job_id;
    spec.owner_uid = s->info().owner_uid;
    spec.ranks = ranks;
    spec.nodes = nodes;
    spec.this_node = this_node;
    spec.first_epoch = first_epoch;
    spec.qos_class = job.priority_level;
    spec.timeout_ns = int64_t{config_.collective_timeout_ms} * 1'000'000;
    spec.max_pending = config_.ring_entries;
    spec.observer = observer_;
    if (cluster_ != nullptr && !nodes.empty()) {
      ClusterDirectory* cluster = cluster_;
      spec.on_epoch_failed = [cluster, key](uint32_t epoch, const absl::Status& why,
                                            uint64_t completed_seq) {
        cluster->ReportEpochFailed(key, epoch, completed_seq, std::string(why.message()));
      };
    }
    if (nodes.empty()) nodes.assign(ranks.size(), this_node);
    group = std::make_shared<Group>(std::move(spec), engine_,
                                    [this](uint32_t gid) { return FindGroup(gid); });
    EngineGroupSpec es{key, first_epoch, ranks, std::move(nodes), this_node};
    if (absl::Status created = engine_->CreateGroup(es); !created.ok()) {
      ledger_.ReleaseMembers(s->info().owner_uid, ranks.size());
      return created;
    }
    if (!group->spans_nodes() && config_.small_op_bytes > 0 &&
        (s->info().features & shm::kFeatureSmallOpArena) != 0 &&
        ranks.size() <= shm::kArenaMaxMembers) {
      absl::StatusOr<std::shared_ptr<SmallOpArena>> arena =
          SmallOpArena::Create(static_cast<uint32_t>(ranks.size()), config_.small_op_slots,
                               config_.small_op_bytes, first_epoch, arena_budget_,
                               s->info().owner_uid, arena_reaper_);
      if (arena.ok()) {
        group->SetArena(*std::move(arena));
      } else {
        HSDP_LOG(Warning) << "group " << id << " (" << s->info().job().Describe()
                          << ") runs without a small-operation arena: " << arena.status();
      }
    }
    groups_[id] = group;
    job.groups[key] = id;
    job.group_members += ranks.size();
    if (group->spans_nodes()) {
      HSDP_LOG(Info) << "group " << id << " (" << s->info().job().Describe() << ", " << ranks.size()
                     << " ranks) spans nodes; epoch " << first_epoch;
    }
  }
  job.calls[{s->id(), ranks}] = k + 1;  // counted only once accepted
  return group;
}

void SessionManager::OnPeerLost(int node, const std::string& why,
                                const std::string& old_instance) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, g] : groups_) groups.push_back(g);
  }
  for (const std::shared_ptr<Group>& g : groups) g->PeerLost(node, why, old_instance);
}

void SessionManager::OnPeerJoined(int node) {
  for (const std::shared_ptr<Group>& g : AllGroups()) g->PeerJoined(node);
}

void SessionManager::OnGroupEvent(const std::string& key, uint32_t epoch, int origin,
                                  const std::string& why, uint64_t completed_seq) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, g] : groups_) {
      if (g->key() == key && g->spans_nodes()) groups.push_back(g);
    }
  }
  for (const std::shared_ptr<Group>& g : groups) {
    // `why` comes from the origin's daemon (its group ids are its own).
    g->RemoteEpochFailed(epoch,
                         absl::AbortedError(absl::StrCat("node ", origin, " reports: ", why)),
                         completed_seq);
  }
}

std::shared_ptr<Group> SessionManager::FindGroup(uint32_t group_id) const {
  absl::MutexLock l(&mu_);
  auto it = groups_.find(group_id);
  return it == groups_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Group>> SessionManager::AllGroups() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Group>> out;
  for (auto& [id, g] : groups_) out.push_back(g);
  return out;
}

}  // namespace hsdp
