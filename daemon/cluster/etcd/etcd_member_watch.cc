// EtcdMember's watch: the changes under P m/ as they happen (a node's key
// put or gone, the epoch, group events), turned into PeerEvents and group
// events; a loss moves the epoch on (AdvanceEpochPast). See etcd_member.h.
#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/etcd/etcd_member.h"
#include "daemon/jobs/cluster_directory.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

using etcd::Compare;
using etcd::Op;

}  // namespace

int64_t EtcdMember::AdvanceEpochPast(int64_t revision) {
  const std::string key = Key("epoch");
  rpcs_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<etcd::RangeResult> r = etcd_->Range(key, "", absl::Seconds(2));
  if (!r.ok()) return 0;  // the next loss or join moves it on
  std::vector<etcd::KeyValue> now = std::move(r->kvs);
  for (int attempt = 0; attempt < 16; ++attempt) {
    int64_t epoch = 0, mod = 0;
    if (!now.empty()) {
      (void)absl::SimpleAtoi(now.front().value, &epoch);
      mod = now.front().mod_revision;
    }
    if (mod > revision) return epoch;  // written after the change: done
    // Compare-and-put; a failed compare reads the new value in the same call.
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<etcd::TxnResult> t = etcd_->Txn(
        {Compare::Unchanged(key, mod)}, {Op::Put(key, absl::StrCat(epoch + 1))}, {Op::Get(key)}, absl::Seconds(2));
    if (!t.ok()) return 0;
    if (t->succeeded) return epoch + 1;
    now = t->ranges.empty() ? std::vector<etcd::KeyValue>{} : std::move(t->ranges[0]);
  }
  return 0;
}

void EtcdMember::Apply(const etcd::WatchEvent& e, std::vector<PeerEvent>* out,
                       std::vector<v1::GroupEvent>* group_out, int64_t* lost_at) {
  const std::string base = Key("");
  if (!absl::StartsWith(e.kv.key, base)) return;
  const std::string rest = e.kv.key.substr(base.size());
  const bool put = e.type == etcd::WatchEvent::Type::kPut;
  int rank = -1;
  absl::MutexLock l(&mu_);
  if (rest == "epoch") {
    uint64_t epoch = 0;
    if (put && absl::SimpleAtoi(e.kv.value, &epoch)) epoch_ = std::max(epoch_, epoch);
    return;
  }
  if (absl::StartsWith(rest, "nodes/")) {
    if (!absl::SimpleAtoi(rest.substr(6), &rank) || rank < 0 ||
        rank >= static_cast<int>(options_.nodes)) {
      return;
    }
    auto it = peers_.find(rank);
    const bool was_alive = it != peers_.end() && it->second.node.state() == "alive";
    if (!put) {
      if (rank == rank_) return;  // this node's own key: the heartbeat finds out and rejoins
      if (!was_alive) return;
      it->second.node.set_state("lost");
      it->second.since = absl::Now();
      out->push_back({PeerEvent::Kind::kLost, rank,
                      absl::StrCat("node ", rank, " (", it->second.node.address(),
                                   ") was lost (its lease in etcd expired: no heartbeat for ",
                                   absl::FormatDuration(options_.heartbeat *
                                                        static_cast<int64_t>(
                                                            options_.missed_heartbeats)),
                                   ", or it left); cluster epoch ", epoch_ + 1)});
      // One member moves the epoch on, not all N: the lost node's successor
      // (the next live rank after it, cyclically, in this view). A successor
      // that died too is lost itself, and its own successor covers both.
      int successor = -1;
      for (auto next = std::next(it);; ++next) {
        if (next == peers_.end()) next = peers_.begin();
        if (next == it) break;
        if (next->second.node.state() == "alive") {
          successor = next->first;
          break;
        }
      }
      if (successor == rank_) *lost_at = std::max(*lost_at, e.kv.mod_revision);
      return;
    }
    v1::ClusterNode n;
    if (e.kv.value.size() > kMaxNodeValue || !n.ParseFromString(e.kv.value)) {
      HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: ignoring a malformed entry for node " << rank
                                     << " in " << etcd_->name();
      return;
    }
    n.set_node_rank(rank);
    n.set_state("alive");
    if (rank == rank_) {
      if (n.instance() != instance_) {
        HSDP_LOG_EVERY_N_SEC(Error, 5)
            << "cluster: node rank " << rank << " was taken by " << n.address()
            << " (instance " << n.instance()
            << "), a daemon with this node's cluster.listen: give each daemon its own";
      }
      return;
    }
    const bool restarted = was_alive && it->second.node.instance() != n.instance();
    if (restarted) {
      out->push_back({PeerEvent::Kind::kLost, rank,
                      absl::StrCat("node ", rank, " (", n.address(), ") restarted; cluster epoch ",
                                   epoch_),
                      /*old_instance=*/it->second.node.instance()});
    }
    if (!was_alive || restarted) {
      out->push_back({PeerEvent::Kind::kJoined, rank,
                      absl::StrCat("node ", rank, " (", n.address(), ") joined; cluster epoch ",
                                   epoch_)});
    }
    peers_[rank] = Peer{n, absl::Now()};
    return;
  }
  if (absl::StartsWith(rest, "events/") && put) {
    if (!absl::SimpleAtoi(rest.substr(7), &rank) || rank == rank_ || rank < 0 ||
        rank >= static_cast<int>(options_.nodes)) {
      return;
    }
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

void EtcdMember::WatchLoop(int64_t from) {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<std::unique_ptr<etcd::Watch>> watch =
        etcd_->StartWatch(Key(""), etcd::PrefixEnd(Key("")), from, absl::Seconds(2));
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
        if (lost_at != 0) AdvanceEpochPast(lost_at);
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
          etcd_->Range(Key("nodes/"), etcd::PrefixEnd(Key("nodes/")), absl::Seconds(2));
      if (all.ok()) {
        std::vector<PeerEvent> fired;
        std::vector<v1::GroupEvent> ignored;
        int64_t lost_at = 0;
        std::set<int> present;
        for (const etcd::KeyValue& kv : all->kvs) {
          int rank = -1;
          if (absl::SimpleAtoi(kv.key.substr(Key("nodes/").size()), &rank)) present.insert(rank);
          Apply(etcd::WatchEvent{etcd::WatchEvent::Type::kPut, kv}, &fired, &ignored, &lost_at);
        }
        std::vector<int> gone;
        {
          absl::MutexLock l(&mu_);
          for (const auto& [r, p] : peers_) {
            if (r != rank_ && p.node.state() == "alive" && !present.contains(r)) gone.push_back(r);
          }
        }
        for (int r : gone) {
          etcd::KeyValue kv;
          kv.key = NodeKey(r);
          kv.mod_revision = all->revision;
          Apply(etcd::WatchEvent{etcd::WatchEvent::Type::kDelete, kv}, &fired, &ignored, &lost_at);
        }
        if (lost_at != 0) AdvanceEpochPast(lost_at);
        FirePeerEvents(fired, events_);
        from = all->revision + 1;
      }
    }
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
  }
}

}  // namespace hsdp
