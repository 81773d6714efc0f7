// EtcdMember's watch: the changes under P m/ as they happen (a node's key
// put or gone, the epoch, group events), turned into PeerEvents and group
// events; a loss moves the epoch on (EtcdJoin::AdvanceEpochPast). See
// etcd_member.h.
#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/etcd/etcd_member.h"
#include "daemon/jobs/cluster_directory.h"
#include "hsdp/common/logging.h"

namespace hsdp {

bool EtcdMember::ParseNode(const etcd::KeyValue& kv, int rank, v1::ClusterNode* n) const {
  if (kv.value.size() > kMaxNodeValue || !n->ParseFromString(kv.value)) {
    HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: ignoring a malformed entry for node " << rank
                                   << " in " << etcd_->name();
    return false;
  }
  n->set_node_rank(rank);
  n->set_state("alive");
  return true;
}

bool EtcdMember::SuccessorOfLocked(int rank) const {
  // One member moves the epoch on, not all N: the lost node's successor
  // (the next live rank after it, cyclically, in this view). A successor
  // that died too is lost itself, and its own successor covers both.
  return rank_ >= 0 && view_.LiveSuccessor(rank) == rank_;
}

void EtcdMember::Apply(const etcd::WatchEvent& e, std::vector<PeerEvent>* out,
                       std::vector<v1::GroupEvent>* group_out, int64_t* lost_at) {
  const bool put = e.type == etcd::WatchEvent::Type::kPut;
  absl::MutexLock l(&mu_);
  if (e.kv.key == keys_.Epoch()) {
    uint64_t epoch = 0;
    if (put && absl::SimpleAtoi(e.kv.value, &epoch)) view_.RaiseEpoch(epoch);
    return;
  }
  const absl::Time now = absl::Now();
  if (int rank = etcd::EtcdKeys::RankIn(e.kv.key, keys_.Nodes()); rank >= 0) {
    if (rank >= static_cast<int>(options_.nodes)) return;
    if (!put) {
      if (rank == rank_) return;  // this node's own key: the heartbeat finds out and rejoins
      std::vector<PeerEvent> lost = view_.Lost(rank, view_.epoch() + 1, rank_, now);
      if (lost.empty()) return;  // was not alive
      out->insert(out->end(), lost.begin(), lost.end());
      if (SuccessorOfLocked(rank)) *lost_at = std::max(*lost_at, e.kv.mod_revision);
      return;
    }
    v1::ClusterNode n;
    if (!ParseNode(e.kv, rank, &n)) return;
    if (rank == rank_) {
      if (n.instance() != instance_) {
        HSDP_LOG_EVERY_N_SEC(Error, 5)
            << "cluster: node rank " << rank << " was taken by " << n.address()
            << " (instance " << n.instance()
            << "), a daemon with this node's cluster.listen: give each daemon its own";
      }
      return;
    }
    std::vector<PeerEvent> changed = view_.Alive(std::move(n), view_.epoch(), rank_, now);
    out->insert(out->end(), changed.begin(), changed.end());
    return;
  }
  if (int rank = etcd::EtcdKeys::RankIn(e.kv.key, keys_.Events()); rank >= 0 && put) {
    if (rank == rank_ || rank >= static_cast<int>(options_.nodes)) return;
    v1::ReportRequest req;
    if (e.kv.value.size() > kMaxEventsValue || !req.ParseFromString(e.kv.value) ||
        static_cast<size_t>(req.events_size()) > kMaxReportEvents) {
      HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: ignoring malformed group events from node "
                                     << rank << " in " << etcd_->name();
      return;
    }
    for (v1::GroupEvent& g : *req.mutable_events()) {
      if (g.group_key().empty() || g.group_key().size() > kMaxEventField ||
          g.why().size() > kMaxEventField || g.epoch() < 1 || g.epoch() >= kMaxGroupEpoch) {
        continue;
      }
      g.set_origin_node(rank);
      group_out->push_back(std::move(g));
    }
  }
}

void EtcdMember::Reread(const std::vector<etcd::KeyValue>& nodes, int64_t revision) {
  std::vector<v1::ClusterNode> alive;
  for (const etcd::KeyValue& kv : nodes) {
    const int rank = etcd::EtcdKeys::RankIn(kv.key, keys_.Nodes());
    v1::ClusterNode n;
    if (rank >= 0 && rank < static_cast<int>(options_.nodes) && ParseNode(kv, rank, &n)) {
      alive.push_back(std::move(n));
    }
  }
  std::vector<PeerEvent> fired;
  bool step = false;
  {
    absl::MutexLock l(&mu_);
    // This node's own entry stays as it is (the heartbeat looks after it).
    if (const v1::ClusterNode* self = view_.Find(rank_); self != nullptr) {
      std::erase_if(alive, [&](const v1::ClusterNode& n) { return n.node_rank() == rank_; });
      alive.push_back(*self);
    }
    fired = view_.Present(alive, view_.epoch() + 1, rank_, absl::Now());
    for (const PeerEvent& e : fired) {
      if (e.kind == PeerEvent::Kind::kLost && e.old_instance.empty() && SuccessorOfLocked(e.node)) {
        step = true;
      }
    }
  }
  if (step) join_.AdvanceEpochPast(revision);
  FirePeerEvents(fired, events_);
}

void EtcdMember::WatchLoop(int64_t from) {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<std::unique_ptr<etcd::Watch>> watch =
        etcd_->StartWatch(keys_.Member(""), etcd::PrefixEnd(keys_.Member("")), from,
                            absl::Seconds(2));
    absl::Status status = watch.status();
    if (watch.ok()) {
      {
        absl::MutexLock l(&mu_);
        if (stopping_) return;
        watch_ = watch->get();
      }
      std::vector<etcd::WatchEvent> events;
      while (status.ok()) {
        events.clear();
        status = (*watch)->Next(&events, absl::Now() + absl::Milliseconds(500));
        std::vector<PeerEvent> fired;
        std::vector<v1::GroupEvent> groups;
        int64_t lost_at = 0;
        for (const etcd::WatchEvent& e : events) {
          Apply(e, &fired, &groups, &lost_at);
          from = std::max(from, e.kv.mod_revision + 1);
        }
        if (lost_at != 0) join_.AdvanceEpochPast(lost_at);
        FirePeerEvents(fired, events_);
        for (const v1::GroupEvent& g : groups) {
          if (group_events_) group_events_(g);
        }
        absl::MutexLock l(&mu_);
        if (stopping_) status = absl::CancelledError("stopping");
      }
      absl::MutexLock l(&mu_);
      watch_ = nullptr;
      if (stopping_) return;
    }
    if (status.code() == absl::StatusCode::kOutOfRange) {
      // Compacted past what this node saw: start from now. Losses in the gap
      // still show (the node keys are gone); group events in it are lost and
      // their groups fail at their deadline instead.
      HSDP_LOG(Error) << "cluster: missed membership changes in " << etcd_->name() << " ("
                      << status.message() << "); reading the membership again";
      rpcs_.fetch_add(1, std::memory_order_relaxed);
      absl::StatusOr<etcd::RangeResult> all =
          etcd_->Range(keys_.Nodes(), etcd::PrefixEnd(keys_.Nodes()), absl::Seconds(2));
      if (all.ok()) {
        Reread(all->kvs, all->revision);
        from = all->revision + 1;
      }
    }
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
  }
}

}  // namespace hsdp
