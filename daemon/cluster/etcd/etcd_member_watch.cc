// EtcdMember's watch: the changes under P w/ as they happen (news of a
// node, group events, the sweeper's key), turned into PeerEvents, group
// events and campaigns. See etcd_member.h.
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

void EtcdMember::ApplyNewsLocked(int rank, const std::string& value,
                                 std::vector<PeerEvent>* out) {
  if (rank < 0 || rank >= static_cast<int>(options_.nodes)) return;
  v1::ClusterNode n;
  if (value.size() > kMaxNodeValue || !n.ParseFromString(value) ||
      (n.state() != "alive" && n.state() != "lost")) {
    HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: ignoring malformed news of node " << rank
                                   << " in " << etcd_->name();
    return;
  }
  n.set_node_rank(rank);
  if (rank == rank_) {
    if (n.state() == "lost" && n.instance() == instance_) {
      HSDP_LOG_EVERY_N_SEC(Warning, 5)
          << "cluster: etcd reports this node lost (its lease expired); the heartbeat joins again";
    } else if (n.state() == "alive" && n.instance() != instance_) {
      HSDP_LOG_EVERY_N_SEC(Error, 5)
          << "cluster: node rank " << rank << " was taken by " << n.address() << " (instance "
          << n.instance() << "), a daemon with this node's cluster.listen: give each daemon its own";
    }
    return;
  }
  view_.RaiseEpoch(n.changed_epoch());
  MemberView::Nodes one;
  *one.Add() = std::move(n);
  std::vector<PeerEvent> events =
      view_.Apply(view_.epoch(), one, /*delta=*/true, rank_, absl::Now());
  out->insert(out->end(), events.begin(), events.end());
}

void EtcdMember::Apply(const etcd::WatchEvent& e, std::vector<PeerEvent>* out,
                       std::vector<v1::GroupEvent>* group_out) {
  const bool put = e.type == etcd::WatchEvent::Type::kPut;
  absl::MutexLock l(&mu_);
  if (e.kv.key == keys_.Sweeper()) {
    sweeper_seen_ = put;
    campaign_at_ = put ? absl::InfiniteFuture() : CampaignTimeLocked();
    return;
  }
  if (int rank = etcd::EtcdKeys::RankIn(e.kv.key, keys_.News()); rank >= 0) {
    if (put) ApplyNewsLocked(rank, e.kv.value, out);
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

void EtcdMember::Reread(const std::vector<etcd::KeyValue>& news) {
  std::vector<PeerEvent> fired;
  {
    absl::MutexLock l(&mu_);
    for (const etcd::KeyValue& kv : news) {
      ApplyNewsLocked(etcd::EtcdKeys::RankIn(kv.key, keys_.News()), kv.value, &fired);
    }
  }
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
        etcd_->StartWatch(keys_.Watched(), etcd::PrefixEnd(keys_.Watched()), from,
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
        for (const etcd::WatchEvent& e : events) {
          Apply(e, &fired, &groups);
          from = std::max(from, e.kv.mod_revision + 1);
        }
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
      // Compacted past what this node saw: read the news and the sweeper's
      // key again and go on from there. Group events in the gap are lost
      // and their groups fail at their deadline instead.
      HSDP_LOG(Error) << "cluster: missed membership changes in " << etcd_->name() << " ("
                      << status.message() << "); reading the news again";
      rpcs_.fetch_add(1, std::memory_order_relaxed);
      absl::StatusOr<etcd::TxnResult> read = etcd_->Txn(
          {}, {etcd::Op::Get(keys_.News(), etcd::PrefixEnd(keys_.News())),
               etcd::Op::Get(keys_.Sweeper())},
          {}, absl::Seconds(2));
      if (read.ok() && read->ranges.size() == 2) {
        Reread(read->ranges[0]);
        absl::MutexLock l(&mu_);
        sweeper_seen_ = !read->ranges[1].empty();
        if (!sweeper_seen_ && campaign_at_ == absl::InfiniteFuture()) {
          campaign_at_ = CampaignTimeLocked();
        }
        from = read->revision + 1;
      }
    }
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
  }
}

}  // namespace hsdp
