#include "daemon/cluster/etcd/etcd_member.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/random/distributions.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/cluster/heartbeat_health.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}

}  // namespace

EtcdMember::EtcdMember(etcd::EtcdClient* etcd, EtcdStore* store, Options options,
                       PeerEvents events, GroupEvents group_events)
    : etcd_(etcd), store_(store), options_(std::move(options)), events_(std::move(events)),
      group_events_(std::move(group_events)), instance_(NewInstanceId()),
      keys_(options_.prefix),
      join_(etcd_,
            {.prefix = options_.prefix,
             .address = options_.address,
             .nodes = options_.nodes,
             .node_rank = options_.node_rank},
            &rpcs_),
      // Attempts up to 5 s, pauses growing to 5 s: a thousand nodes that
      // cannot reach an overloaded etcd must not retry in lockstep, which
      // would keep it overloaded.
      retry_({.store = etcd_->name(),
              .where = absl::StrCat(" in ", etcd_->name()),
              .permission_hint = absl::StrCat(
                  " (the etcd user needs read-write access to the keys under "
                  "cluster.etcd.prefix \"",
                  options_.prefix, "\")"),
              .join_timeout = options_.join_timeout,
              .attempt = absl::Seconds(5),
              .max_backoff = absl::Seconds(5)}),
      view_(options_.nodes,
            absl::StrCat("its lease in etcd expired: no heartbeat for ",
                         absl::FormatDuration(options_.heartbeat *
                                              static_cast<int64_t>(options_.missed_heartbeats)),
                         ", or it left"),
            MemberView::Kind::kSparse),
      outbox_(kMaxOutbox, etcd_->name()) {}

EtcdMember::~EtcdMember() { Stop(); }

absl::Status EtcdMember::JoinOnce(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(join_.CheckNodes(deadline));
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
  me.set_data_address(options_.data_address);
  me.set_name(options_.name);
  me.set_instance(instance_);
  bool want_list;
  {
    absl::MutexLock l(&mu_);
    want_list = view_.stale();  // a rejoin: every node counts as lost until this list
  }
  absl::StatusOr<etcd::EtcdJoin::Claimed> claimed = join_.Claim(me, lease, deadline, want_list);
  if (!claimed.ok()) {
    if (claimed.status().code() == absl::StatusCode::kNotFound) {
      // The lease ran out before the join took (joining outlasted its TTL,
      // and nothing renews it before then): the next attempt grants a new
      // one instead of failing the same way forever.
      absl::MutexLock l(&mu_);
      if (lease_ == lease) lease_ = 0;
    }
    return claimed.status();
  }
  store_->SetLease(lease);
  std::vector<PeerEvent> fired;
  {
    absl::MutexLock l(&mu_);
    rank_ = claimed->rank;
    view_.RaiseEpoch(claimed->epoch);
    const absl::Time now = absl::Now();
    status_.Contact(now);
    fired = view_.Present(claimed->live, claimed->epoch, rank_, now);
    // Changes after the read are replayed by the watch (idempotently).
    watch_from_ = claimed->revision + 1;
    if (!watching_) {  // else a rejoin: the watch tells about the sweeper's key
      sweeper_seen_ = !claimed->sweeper_absent;
      campaign_at_ = sweeper_seen_ ? absl::InfiniteFuture() : CampaignTimeLocked();
    }
  }
  FirePeerEvents(fired, events_);
  return absl::OkStatus();
}

absl::Status EtcdMember::Start() {
  const absl::Status joined = retry_.Run([this](absl::Duration t) { return JoinOnce(t); });
  if (!joined.ok()) {
    absl::MutexLock l(&mu_);
    if (!absl::IsCancelled(joined)) status_.Failed(retry_.last());
    return joined;
  }
  HSDP_LOG(Info) << "cluster: joined through " << etcd_->name() << " as node " << node_rank()
                 << " of " << options_.nodes << " (epoch " << epoch() << ")";
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::CancelledError("cluster: stopped while joining");
  const int64_t from = watch_from_;
  watching_ = true;
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
  retry_.Cancel();
  StopSweeper();
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
        etcd_->Put(keys_.EventsOf(req.node_rank()),
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
    lost = view_.LoseAll(
        rank_, absl::StrCat("this node lost its membership in ", etcd_->name(), " (", why, ")"),
        absl::Now());
    lease_ = 0;
    rank_ = -1;
  }
  StopSweeper();  // its key went with the lease
  store_->SetLease(0);
  FirePeerEvents(lost, events_);
}

absl::Time EtcdMember::CampaignTimeLocked() const {
  const int tier = std::min(std::max(rank_, 0) / 8, 3);
  return absl::Now() + absl::Seconds(tier) +
         absl::Milliseconds(250) * (static_cast<double>(absl::Uniform(bitgen_, 0, 1000)) / 1000);
}

void EtcdMember::Campaign() {
  int rank;
  int64_t lease;
  const absl::Duration timeout = std::max(options_.heartbeat, absl::Milliseconds(500));
  {
    absl::MutexLock l(&mu_);
    if (stopping_ || sweeper_ != nullptr || sweeper_seen_) {
      campaign_at_ = absl::InfiniteFuture();
      return;
    }
    if (rank_ < 0) {  // joining again: campaign once joined
      campaign_at_ = absl::Now() + options_.heartbeat;
      return;
    }
    rank = rank_;
    lease = lease_;
    campaign_at_ = absl::Now() + options_.heartbeat;  // again unless this settles it
  }
  rpcs_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<etcd::TxnResult> t =
      etcd_->Txn({etcd::Compare::Unchanged(keys_.Sweeper(), 0)},
                 {etcd::Op::Put(keys_.Sweeper(), absl::StrCat(rank), lease)}, {}, timeout);
  if (!t.ok()) return;
  absl::MutexLock l(&mu_);
  if (!t->succeeded) return;  // another member is the sweeper: the watch says so
  campaign_at_ = absl::InfiniteFuture();
  sweeper_seen_ = true;
  if (stopping_ || rank_ != rank) return;  // the key goes with the lease
  HSDP_LOG(Info) << "cluster: node " << rank << " is the sweeper (it publishes the losses of "
                 << "nodes in " << etcd_->name() << ")";
  sweeper_ = std::make_unique<etcd::EtcdSweeper>(etcd_, &join_, options_.prefix, options_.nodes,
                                                 &rpcs_);
  sweeper_thread_ = std::thread([s = sweeper_.get()] { s->Run(); });
}

void EtcdMember::StopSweeper() {
  std::unique_ptr<etcd::EtcdSweeper> sweeper;
  std::thread thread;
  {
    absl::MutexLock l(&mu_);
    sweeper = std::move(sweeper_);
    thread = std::move(sweeper_thread_);
  }
  if (sweeper != nullptr) sweeper->Stop();
  if (thread.joinable()) thread.join();
}

bool EtcdMember::sweeping() const {
  absl::MutexLock l(&mu_);
  return sweeper_ != nullptr;
}

uint64_t EtcdMember::losses_published() const {
  absl::MutexLock l(&mu_);
  return sweeper_ == nullptr ? 0 : sweeper_->published();
}

void EtcdMember::HeartbeatLoop() {
  HeartbeatHealth health(etcd_->name(), options_.missed_heartbeats,
                         " until etcd has a quorum again (see docs/cluster.md)");
  bool joined = true;
  absl::Time next = absl::Now() + options_.heartbeat;
  for (;;) {
    bool campaign;
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &EtcdMember::WakeLocked),
                            std::min(next, campaign_at_));
      if (stopping_) return;
      campaign = joined && absl::Now() >= campaign_at_;
    }
    if (campaign) Campaign();
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
      health.Answered();
      absl::MutexLock l(&mu_);
      const absl::Time now = absl::Now();
      status_.Contact(now);
      view_.Vouch(now);  // every live node's key is in etcd, as the watch says
      continue;
    }
    if (std::optional<std::string> degraded = health.Missed(status)) {
      absl::MutexLock l(&mu_);
      status_.Degraded(*std::move(degraded));
    }
  }
}

v1::NodesResponse EtcdMember::View() const {
  absl::MutexLock l(&mu_);
  return view_.Response(status_, rank_, etcd_->name(), /*is_coordinator=*/false, absl::Now());
}

v1::NodesResponse EtcdMember::ClusterView() const {
  bool in_contact;
  {
    absl::MutexLock l(&mu_);
    in_contact = status_.state() == "ok";
  }
  // Out of contact (joining, degraded, failed) etcd is not asked: `hsdpctl
  // nodes` answers at once with what this member holds.
  std::optional<v1::ListResponse> list;
  if (in_contact) {
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<etcd::TxnResult> read = etcd_->Txn(
        {}, {etcd::Op::Get(keys_.Nodes(), etcd::PrefixEnd(keys_.Nodes())),
             etcd::Op::Get(keys_.Epoch())},
        {}, absl::Seconds(1));
    if (read.ok() && read->ranges.size() == 2) {
      list.emplace();
      for (const etcd::KeyValue& kv : read->ranges[0]) {
        const int rank = etcd::EtcdKeys::RankIn(kv.key, keys_.Nodes());
        v1::ClusterNode n;
        if (rank >= 0 && rank < static_cast<int>(options_.nodes) && ParseNode(kv, rank, &n)) {
          *list->add_nodes() = std::move(n);  // changed_epoch 0: shown as it is
        }
      }
      uint64_t epoch = 0;
      if (!read->ranges[1].empty()) (void)absl::SimpleAtoi(read->ranges[1][0].value, &epoch);
      list->set_epoch(epoch);
    } else {
      HSDP_LOG_EVERY_N_SEC(Warning, 5)
          << "cluster: " << (read.ok() ? "etcd answered a read of 2 ranges with fewer"
                                       : std::string(read.status().message()))
          << "; showing the nodes this member heard of";
    }
  }
  absl::MutexLock l(&mu_);
  v1::NodesResponse r = view_.Response(status_, rank_, etcd_->name(), /*is_coordinator=*/false,
                                       absl::Now());
  if (list.has_value()) {
    // The epoch moves on with joins too, which this member does not hear
    // of: it shows the store's (as ClusterMember shows the coordinator's).
    r.set_epoch(std::max(r.epoch(), list->epoch()));
    list->set_epoch(r.epoch());
    view_.AddUnheard(*list, &r);
  }
  return r;
}

uint64_t EtcdMember::epoch() const {
  absl::MutexLock l(&mu_);
  return view_.epoch();
}

int EtcdMember::node_rank() const {
  absl::MutexLock l(&mu_);
  return rank_;
}

}  // namespace hsdp
