#include "daemon/cluster/etcd/etcd_member.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

using etcd::Compare;
using etcd::Op;

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}

constexpr int kRankDigits = 5;  // ranks < 4096

// A uniform double in [0, 1), per thread.
double Uniform01() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

EtcdMember::EtcdMember(etcd::EtcdClient* etcd, EtcdStore* store, Options options,
                       PeerEvents events, GroupEvents group_events)
    : etcd_(etcd), store_(store), options_(std::move(options)), events_(std::move(events)),
      group_events_(std::move(group_events)), instance_(NewInstanceId()),
      outbox_(kMaxOutbox, etcd_->name()) {}

EtcdMember::~EtcdMember() { Stop(); }

std::string EtcdMember::NodeKey(int rank) const {
  return Key(absl::StrFormat("nodes/%0*d", kRankDigits, rank));
}

absl::Status EtcdMember::CheckNodes(absl::Time deadline) {
  const std::string key = Key("config");
  const std::string mine = absl::StrCat("nodes=", options_.nodes);
  // A read first: once the cluster exists (every join but the first), no
  // write goes through raft for this check.
  rpcs_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<etcd::RangeResult> r = etcd_->Range(key, "", Left(deadline));
  if (!r.ok()) return r.status();
  std::string theirs;
  if (!r->kvs.empty()) {
    theirs = r->kvs.front().value;
  } else {
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<etcd::TxnResult> t =
        etcd_->Txn({Compare::Unchanged(key, 0)}, {Op::Put(key, mine)}, {Op::Get(key)}, Left(deadline));
    if (!t.ok()) return t.status();
    if (t->succeeded || t->ranges.empty() || t->ranges[0].empty()) return absl::OkStatus();
    theirs = t->ranges[0][0].value;
  }
  if (theirs != mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.nodes is ", options_.nodes, " here, but the cluster under ", options_.prefix,
        " in ", etcd_->name(), " was formed with ", theirs.substr(0, 32),
        " (a wrong cluster.etcd.prefix, or a cluster.nodes that differs between nodes)"));
  }
  return absl::OkStatus();
}

absl::Status EtcdMember::JoinOnce(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CheckNodes(deadline));
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
  }
  if (lease == 0) {
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<int64_t> granted = etcd_->LeaseGrant(
        options_.heartbeat * static_cast<int64_t>(options_.missed_heartbeats), Left(deadline));
    if (!granted.ok()) return granted.status();
    lease = *granted;
    absl::MutexLock l(&mu_);
    lease_ = lease;
  }
  v1::ClusterNode me;
  me.set_address(options_.address);
  me.set_data_address(options_.data_address);
  me.set_name(options_.name);
  me.set_instance(instance_);
  me.set_state("alive");
  for (int attempt = 0; absl::Now() < deadline; ++attempt) {
    if (attempt > 0) {
      // Lost a race for a rank: back off (jittered, growing), so that
      // hundreds of nodes starting together do not retry in lockstep.
      const absl::Duration cap =
          std::min(absl::Milliseconds(20) * (int64_t{1} << std::min(attempt, 6)), Left(deadline));
      absl::SleepFor(cap * Uniform01());
    }
    // One consistent read of what a join needs (not the events under m/).
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<etcd::TxnResult> read = etcd_->Txn(
        {}, {Op::Get(Key("nodes/"), etcd::PrefixEnd(Key("nodes/"))),
             Op::Get(HistoryKey(""), etcd::PrefixEnd(HistoryKey(""))), Op::Get(Key("epoch"))},
        {}, Left(deadline));
    if (!read.ok()) return read.status();
    if (read->ranges.size() != 3) return absl::InternalError("etcd answered a read of 3 ranges with fewer");
    std::map<int, std::pair<v1::ClusterNode, const etcd::KeyValue*>> live;
    std::map<int, std::string> history;
    int64_t epoch = 0;
    std::vector<const etcd::KeyValue*> kvs;
    for (const auto& range : read->ranges) {
      for (const etcd::KeyValue& kv : range) kvs.push_back(&kv);
    }
    for (const etcd::KeyValue* kvp : kvs) {
      const etcd::KeyValue& kv = *kvp;
      int rank = -1;
      if (absl::StartsWith(kv.key, HistoryKey(""))) {
        if (absl::SimpleAtoi(kv.key.substr(HistoryKey("").size()), &rank)) history[rank] = kv.value;
        continue;
      }
      const std::string rest = kv.key.substr(Key("").size());
      if (rest == "epoch") {
        (void)absl::SimpleAtoi(kv.value, &epoch);
      } else if (absl::StartsWith(rest, "nodes/") && absl::SimpleAtoi(rest.substr(6), &rank) &&
                 rank >= 0 && rank < static_cast<int>(options_.nodes)) {
        v1::ClusterNode n;
        if (kv.value.size() <= kMaxNodeValue && n.ParseFromString(kv.value)) {
          live[rank] = {n, &kv};
        }
      }
    }
    int rank = options_.node_rank;
    if (rank >= 0) {
      auto it = live.find(rank);
      if (it != live.end() && it->second.first.address() != options_.address) {
        return absl::AlreadyExistsError(absl::StrCat(
            "node rank ", rank, " is held by the live node ", it->second.first.address(),
            " (cluster.node_rank must differ between nodes)"));
      }
    } else {
      for (const auto& [r, n] : live) {
        if (n.first.address() == options_.address) rank = r;  // this node's last instance
      }
      for (const auto& [r, address] : history) {
        if (rank < 0 && address == options_.address && !live.contains(r)) rank = r;
      }
      // Else a rank never held, else one whose node is gone for good; at
      // random, so that nodes starting together rarely want the same one.
      std::vector<int> never, gone;
      for (int r = 0; r < static_cast<int>(options_.nodes); ++r) {
        if (live.contains(r)) continue;
        (history.contains(r) ? gone : never).push_back(r);
      }
      const std::vector<int>& free = never.empty() ? gone : never;
      if (rank < 0 && !free.empty()) {
        rank = free[std::min(free.size() - 1, static_cast<size_t>(Uniform01() * free.size()))];
      }
      if (rank < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "all ", options_.nodes, " node ranks are held by live nodes (cluster.nodes)"));
      }
    }
    me.set_node_rank(rank);
    const auto held = live.find(rank);
    const int64_t held_mod = held == live.end() ? 0 : held->second.second->mod_revision;
    const int64_t old_lease = held == live.end() ? 0 : held->second.second->lease;
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    // Compared against this rank's key only: joins of different ranks never
    // conflict (the epoch moves on after, AdvanceEpochPast).
    absl::StatusOr<etcd::TxnResult> t = etcd_->Txn(
        {Compare::Unchanged(NodeKey(rank), held_mod)},
        {Op::Put(NodeKey(rank), me.SerializeAsString(), lease),
         Op::Put(HistoryKey(absl::StrFormat("%0*d", kRankDigits, rank)), options_.address)},
        {}, Left(deadline));
    if (!t.ok()) {
      if (t.status().code() == absl::StatusCode::kNotFound) {
        // The lease ran out before the join took (joining outlasted its
        // TTL, and nothing renews it before then): the next attempt grants
        // a new one instead of failing the same way forever.
        absl::MutexLock l(&mu_);
        if (lease_ == lease) lease_ = 0;
      }
      return t.status();
    }
    if (!t->succeeded) continue;  // another node took the rank meanwhile: read again
    // This join moves the epoch on (one step may count several joins). In a
    // crowd (many nodes starting together) it waits a little first, so one
    // step covers many joins instead of every watcher seeing N steps.
    absl::SleepFor(std::min(absl::Milliseconds(2) * static_cast<int64_t>(live.size()),
                            absl::Milliseconds(500)) *
                   Uniform01());
    epoch = std::max<int64_t>(epoch + 1, AdvanceEpochPast(t->revision)) - 1;
    if (old_lease != 0 && old_lease != lease) {
      // This node's previous instance: its keys (rendezvous, events) go now.
      rpcs_.fetch_add(1, std::memory_order_relaxed);
      (void)etcd_->LeaseRevoke(old_lease, absl::Seconds(1));
    }
    store_->SetLease(lease);
    std::vector<PeerEvent> fired;
    {
      absl::MutexLock l(&mu_);
      rank_ = rank;
      epoch_ = std::max<uint64_t>(epoch_, epoch + 1);
      status_.Contact(absl::Now());
      for (auto& [r, n] : live) {
        if (r == rank) continue;
        auto it = peers_.find(r);
        if (it == peers_.end() || it->second.node.state() != "alive" ||
            it->second.node.instance() != n.first.instance()) {
          fired.push_back({PeerEvent::Kind::kJoined, r,
                           absl::StrCat("node ", r, " (", n.first.address(),
                                        ") joined; cluster epoch ", epoch + 1)});
        }
        n.first.set_node_rank(r);
        n.first.set_state("alive");
        peers_[r] = Peer{n.first, absl::Now()};
      }
      peers_[rank] = Peer{me, absl::Now()};
      // Changes after the read are replayed by the watch (idempotently).
      watch_from_ = read->revision + 1;
    }
    FirePeerEvents(fired, events_);
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError("the membership kept changing while joining");
}

absl::Status EtcdMember::Start() {
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  absl::Status last;
  for (int attempt = 0;; ++attempt) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return absl::CancelledError("cluster: stopped while joining");
    }
    last = JoinOnce(std::min(left, absl::Seconds(5)));
    if (last.ok()) break;
    if (PermanentJoinError(last)) {
      absl::MutexLock l(&mu_);
      status_.Failed(last);
      const std::string hint =
          last.code() == absl::StatusCode::kPermissionDenied
              ? absl::StrCat(" (the etcd user needs read-write access to the keys under "
                             "cluster.etcd.prefix \"", options_.prefix, "\")")
              : "";
      return absl::Status(last.code(), absl::StrCat("cannot join the cluster in ", etcd_->name(),
                                                    ": ", last.message(), hint));
    }
    if (attempt % 10 == 0) {
      HSDP_LOG(Info) << "cluster: waiting for " << etcd_->name() << " (" << last.message() << ")";
    }
    absl::MutexLock l(&mu_);
    // Back off, jittered and growing (0.2 s to 5 s): a thousand nodes that
    // cannot reach an overloaded etcd must not retry in lockstep, which
    // would keep it overloaded.
    const absl::Duration backoff =
        std::min(absl::Milliseconds(200) * (int64_t{1} << std::min(attempt, 5)), absl::Seconds(5)) *
        (0.5 + Uniform01() / 2);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                         std::min(backoff, std::max(absl::ZeroDuration(), left)));
  }
  if (!last.ok()) {
    absl::MutexLock l(&mu_);
    status_.Failed(last);
    return absl::DeadlineExceededError(absl::StrCat(
        "cannot join the cluster: ", etcd_->name(),
        " did not take this node within cluster.join_timeout_ms (",
        absl::ToInt64Milliseconds(options_.join_timeout), " ms); last error: ", last.message()));
  }
  HSDP_LOG(Info) << "cluster: joined through " << etcd_->name() << " as node " << node_rank()
                 << " of " << options_.nodes << " (epoch " << epoch() << ")";
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::CancelledError("cluster: stopped while joining");
  const int64_t from = watch_from_;
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  watcher_ = std::thread([this, from] { WatchLoop(from); });
  return absl::OkStatus();
}

void EtcdMember::Stop() {
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    status_.Stopped();
    if (watch_ != nullptr) watch_->Cancel();
    lease = lease_;
  }
  if (heartbeat_.joinable()) {
    heartbeat_.join();
    FlushOutbox();  // a last try (bounded by one call's timeout)
  }
  if (watcher_.joinable()) watcher_.join();
  if (lease != 0 && options_.revoke_on_stop) {
    // Leave at once rather than when the lease runs out.
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    (void)etcd_->LeaseRevoke(lease, absl::Seconds(1));
  }
}

void EtcdMember::ReportGroupEvent(v1::GroupEvent event) {
  absl::MutexLock l(&mu_);
  outbox_.Push(std::move(event));
}

bool EtcdMember::WakeLocked() const { return stopping_ || outbox_.ready(); }

bool EtcdMember::FlushOutbox() {
  const absl::Duration timeout = std::max(options_.heartbeat, absl::Milliseconds(500));
  for (;;) {
    v1::ReportRequest req;
    int64_t lease;
    {
      absl::MutexLock l(&mu_);
      if (outbox_.empty()) return true;
      if (rank_ < 0) return false;
      req.set_node_rank(rank_);
      req.set_instance(instance_);
      lease = lease_;
      for (v1::GroupEvent& queued : outbox_.Front(kMaxReportEvents)) {
        v1::GroupEvent* e = req.add_events();
        *e = std::move(queued);
        e->set_origin_node(rank_);
        e->mutable_group_key()->resize(std::min(e->group_key().size(), kMaxEventField));
        e->mutable_why()->resize(std::min(e->why().size(), kMaxEventField));
      }
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<int64_t> put =
        etcd_->Put(Key(absl::StrFormat("events/%0*d", kRankDigits, req.node_rank())),
                   req.SerializeAsString(), lease, timeout);
    if (!put.ok()) {
      HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: cannot report " << req.events_size()
                                     << " group event(s): " << put.status().message();
      return false;
    }
    // One past each failed epoch, so a group created again later starts in
    // line with the others (as the coordinator does on Report).
    for (const v1::GroupEvent& e : req.events()) {
      const std::string key = GroupEpochKey(e.group_key());
      uint32_t known = 0;
      rpcs_.fetch_add(1, std::memory_order_relaxed);
      if (absl::StatusOr<std::string> v = store_->Get(key, timeout); v.ok()) {
        (void)absl::SimpleAtoi(*v, &known);
      }
      if (e.epoch() >= known) {
        rpcs_.fetch_add(1, std::memory_order_relaxed);
        (void)store_->PutUnleased(key, absl::StrCat(e.epoch() + 1), timeout);
      }
    }
    absl::MutexLock l(&mu_);
    outbox_.Pop(req.events_size());
  }
}

void EtcdMember::Rejoin(const std::string& why) {
  std::vector<PeerEvent> lost;
  {
    absl::MutexLock l(&mu_);
    for (auto& [r, p] : peers_) {
      if (r == rank_ || p.node.state() != "alive") continue;
      lost.push_back({PeerEvent::Kind::kLost, r,
                      absl::StrCat("this node lost its membership in ", etcd_->name(), " (", why,
                                   ") and joins again; node ", r, " (", p.node.address(),
                                   ") is treated as lost meanwhile")});
      p.node.set_state("lost");
      p.since = absl::Now();
    }
    lease_ = 0;
    rank_ = -1;
  }
  store_->SetLease(0);
  FirePeerEvents(lost, events_);
}

void EtcdMember::HeartbeatLoop() {
  int failures = 0;
  bool degraded = false;
  bool joined = true;
  absl::Time next = absl::Now() + options_.heartbeat;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &EtcdMember::WakeLocked), next);
      if (stopping_) return;
    }
    const bool sent = joined && FlushOutbox();
    if (absl::Now() < next) {
      absl::MutexLock l(&mu_);
      outbox_.set_held_back(!sent);
      continue;
    }
    next = absl::Now() + options_.heartbeat;
    int64_t lease;
    {
      absl::MutexLock l(&mu_);
      outbox_.set_held_back(false);
      lease = lease_;
    }
    absl::Status status;
    const absl::Duration timeout = std::max(options_.heartbeat, absl::Milliseconds(200));
    if (joined) {
      rpcs_.fetch_add(1, std::memory_order_relaxed);
      status = etcd_->LeaseKeepAlive(lease, timeout).status();
      if (status.code() == absl::StatusCode::kNotFound) {
        HSDP_LOG(Warning) << "cluster: this node's lease in " << etcd_->name()
                          << " expired (no heartbeat reached etcd in time); joining again";
        Rejoin("its lease expired");
        joined = false;
      }
    }
    if (!joined) {
      status = JoinOnce(timeout);
      joined = status.ok();
    }
    if (status.ok()) {
      if (degraded) {
        HSDP_LOG(Info) << "cluster: " << etcd_->name()
                       << " answers again; the cluster is no longer degraded";
      }
      failures = 0;
      degraded = false;
      absl::MutexLock l(&mu_);
      status_.Contact(absl::Now());
      continue;
    }
    ++failures;
    if (failures >= static_cast<int>(options_.missed_heartbeats) && !degraded) {
      degraded = true;
      const std::string detail = absl::StrCat(
          etcd_->name(), " has not answered ", failures, " heartbeats (", status.message(),
          "); membership is frozen, node losses are not detected, and new cross-node groups "
          "and attaches fail until etcd has a quorum again (see docs/cluster.md)");
      HSDP_LOG(Error) << "cluster degraded: " << detail;
      absl::MutexLock l(&mu_);
      status_.Degraded(detail);
    }
  }
}

v1::NodesResponse EtcdMember::View() const {
  absl::MutexLock l(&mu_);
  v1::NodesResponse r;
  r.set_enabled(true);
  const double since_contact = status_.FillView(&r, absl::Now());
  r.set_epoch(epoch_);
  r.set_node_rank(rank_);
  r.set_coordinator(etcd_->name());
  r.set_is_coordinator(false);
  r.set_expected_nodes(options_.nodes);
  for (const auto& [rank, p] : peers_) {
    v1::NodeStatus* s = r.add_nodes();
    s->set_node_rank(rank);
    s->set_address(p.node.address());
    s->set_data_address(p.node.data_address());
    s->set_name(p.node.name());
    s->set_state(p.node.state());
    // Alive: its key is in etcd (its lease renewed), as of the last contact.
    s->set_last_heartbeat_age_s(p.node.state() == "alive"
                                    ? since_contact
                                    : absl::ToDoubleSeconds(absl::Now() - p.since));
    s->set_self(rank == rank_);
  }
  return r;
}

uint64_t EtcdMember::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

int EtcdMember::node_rank() const {
  absl::MutexLock l(&mu_);
  return rank_;
}

}  // namespace hsdp
