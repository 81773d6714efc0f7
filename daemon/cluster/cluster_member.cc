#include "daemon/cluster/cluster_member.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/heartbeat_health.h"
#include "hsdp/common/logging.h"

namespace hsdp {
ClusterMember::ClusterMember(Options options, PeerEvents events, GroupEvents group_events)
    : options_(std::move(options)), events_(std::move(events)),
      group_events_(std::move(group_events)), instance_(NewInstanceId()),
      client_(options_.coordinator, options_.token, options_.credentials),
      join_({.store = absl::StrCat("the coordinator ", options_.coordinator),
             .where = "",
             .permission_hint = "",
             .join_timeout = options_.join_timeout,
             .attempt = absl::Seconds(1),
             .max_backoff = absl::Milliseconds(200)}),
      view_(options_.nodes, "no heartbeat", MemberView::Kind::kSparse),
      outbox_(kMaxOutbox, "the coordinator") {}

ClusterMember::~ClusterMember() { Stop(); }

absl::Status ClusterMember::JoinOnce(absl::Duration timeout) {
  v1::JoinRequest req;
  req.set_address(options_.address);
  req.set_data_address(options_.data_address);
  req.set_name(options_.name);
  req.set_requested_rank(options_.node_rank);
  req.set_nodes(options_.nodes);
  req.set_instance(instance_);
  {
    absl::MutexLock l(&mu_);
    req.set_last_epoch(view_.epoch());
    // The first join starts a sparse view from this join's epoch; joining
    // again (every other node counted lost meanwhile) takes the whole list,
    // so that the nodes alive now are joined again at once.
    req.set_list_optional(!view_.stale());
  }
  rpcs_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<v1::JoinResponse> r = client_.Join(req, timeout);
  if (!r.ok()) return r.status();
  if (r->node_rank() < 0 || static_cast<uint32_t>(r->node_rank()) >= options_.nodes) {
    return absl::InvalidArgumentError(absl::StrCat("the coordinator assigned node rank ",
                                            r->node_rank(), ", outside 0..",
                                            options_.nodes - 1));
  }
  {
    absl::MutexLock l(&mu_);
    rank_ = r->node_rank();
    events_after_ = r->events_last();  // older events concern groups before this join
    status_.Contact(absl::Now());
  }
  Update(r->epoch(), r->nodes(), /*delta=*/false);
  return absl::OkStatus();
}

absl::Status ClusterMember::Start() {
  const absl::Status joined = join_.Run([this](absl::Duration t) { return JoinOnce(t); });
  if (!joined.ok()) {
    absl::MutexLock l(&mu_);
    if (!absl::IsCancelled(joined)) status_.Failed(join_.last());
    return joined;
  }
  HSDP_LOG(Info) << "cluster: joined " << options_.coordinator << " as node " << node_rank()
                 << " of " << options_.nodes << " (epoch " << epoch() << ")";
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::CancelledError("cluster: stopped while joining");
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void ClusterMember::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    status_.Stopped();
  }
  join_.Cancel();
  if (heartbeat_.joinable()) {
    heartbeat_.join();
    FlushOutbox();  // a last try for what this node reported while stopping (bounded)
  }
}

void ClusterMember::Update(uint64_t epoch, const MemberView::Nodes& nodes, bool delta) {
  std::vector<PeerEvent> events;
  {
    absl::MutexLock l(&mu_);
    events = view_.Apply(epoch, nodes, delta, rank_, absl::Now());
  }
  FirePeerEvents(events, events_);
}

void ClusterMember::ReportGroupEvent(v1::GroupEvent event) {
  absl::MutexLock l(&mu_);
  outbox_.Push(std::move(event));
}

bool ClusterMember::WakeLocked() const { return stopping_ || outbox_.ready(); }

bool ClusterMember::FlushOutbox() {
  for (;;) {
    v1::ReportRequest req;
    {
      absl::MutexLock l(&mu_);
      if (outbox_.empty()) return true;
      req.set_node_rank(rank_);
      req.set_instance(instance_);
      for (v1::GroupEvent& e : outbox_.Front(64)) *req.add_events() = std::move(e);
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    const absl::Status s =
        client_.Report(req, std::max(options_.heartbeat, absl::Milliseconds(500)));
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: the coordinator refused " << req.events_size()
                                     << " group event(s): " << s.message();
    } else if (!s.ok()) {
      // Kept for the next try; the others fail the epoch at their own
      // deadline meanwhile.
      HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: cannot report " << req.events_size()
                                     << " group event(s) to the coordinator: " << s.message();
      return false;
    }
    absl::MutexLock l(&mu_);
    outbox_.Pop(req.events_size());
  }
}

void ClusterMember::Deliver(const v1::HeartbeatResponse& r) {
  int self;
  {
    absl::MutexLock l(&mu_);
    self = rank_;
    events_after_ = r.events_last();
  }
  if (r.events_missed()) {
    HSDP_LOG(Error) << "cluster: group events were dropped by the coordinator before this node "
                       "saw them; groups they concerned fail at their deadline instead";
  }
  for (const v1::GroupEvent& e : r.events()) {
    if (e.origin_node() == self) continue;
    if (group_events_) group_events_(e);
  }
}

absl::Status ClusterMember::Rejoin(const absl::Status& why) {
  // The others failed the epochs of every group shared with this node, so
  // it does too.
  HSDP_LOG(Warning) << "cluster: " << why.message() << "; joining again";
  std::vector<PeerEvent> lost;
  {
    absl::MutexLock l(&mu_);
    lost = view_.LoseAll(rank_,
                         absl::StrCat("this node lost contact with the coordinator ",
                                      options_.coordinator, " (", why.message(), ")"),
                         absl::Now());
  }
  FirePeerEvents(lost, events_);
  return JoinOnce(std::max(options_.heartbeat, absl::Milliseconds(500)));
}

void ClusterMember::HeartbeatLoop() {
  HeartbeatHealth health(absl::StrCat("the coordinator ", options_.coordinator),
                         options_.missed_heartbeats,
                         "; restart the coordinator (see docs/cluster.md)");
  absl::Time next = absl::Now() + options_.heartbeat;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &ClusterMember::WakeLocked), next);
      if (stopping_) return;
    }
    const bool sent = FlushOutbox();
    if (absl::Now() < next) {
      // Woken for the outbox: a refused report waits for the next heartbeat.
      absl::MutexLock l(&mu_);
      outbox_.set_held_back(!sent);
      continue;
    }
    next = absl::Now() + options_.heartbeat;
    {
      absl::MutexLock l(&mu_);
      outbox_.set_held_back(false);
    }
    v1::HeartbeatRequest req;
    req.set_node_rank(node_rank());
    req.set_instance(instance_);
    {
      absl::MutexLock l(&mu_);
      req.set_events_after(events_after_);
      req.set_nodes_epoch(view_.nodes_epoch());
      req.set_news_only(view_.news_only());
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<v1::HeartbeatResponse> r =
        client_.Heartbeat(req, std::max(options_.heartbeat, absl::Milliseconds(200)));
    absl::Status status = r.status();
    if (r.ok()) {
      Update(r->epoch(), r->nodes(), r->nodes_delta());
      Deliver(*r);
    } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
      // Declared lost, or a new coordinator.
      status = Rejoin(status);
    }
    if (status.ok()) {
      health.Answered();
      absl::MutexLock l(&mu_);
      status_.Contact(absl::Now());
      continue;
    }
    if (std::optional<std::string> degraded = health.Missed(status)) {
      absl::MutexLock l(&mu_);
      status_.Degraded(*std::move(degraded));
    }
  }
}

v1::NodesResponse ClusterMember::View() const {
  absl::MutexLock l(&mu_);
  return view_.Response(status_, rank_, options_.coordinator, options_.is_coordinator,
                        absl::Now());
}
v1::NodesResponse ClusterMember::ClusterView() const {
  bool in_contact;
  {
    absl::MutexLock l(&mu_);
    in_contact = status_.state() == "ok";
  }
  // Out of contact (joining, degraded, failed) the coordinator is not asked:
  // `hsdpctl nodes` answers at once with what this member holds.
  std::optional<v1::ListResponse> list;
  if (in_contact) {
    absl::StatusOr<v1::ListResponse> answer = client_.List(kListTimeout);
    if (answer.ok()) {
      list = std::move(*answer);
    } else {
      HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: " << answer.status().message()
                                       << "; showing the nodes this member heard of";
    }
  }
  absl::MutexLock l(&mu_);
  v1::NodesResponse r = view_.Response(status_, rank_, options_.coordinator,
                                       options_.is_coordinator, absl::Now());
  if (list.has_value()) view_.AddUnheard(*list, &r);
  return r;
}

uint64_t ClusterMember::epoch() const {
  absl::MutexLock l(&mu_);
  return view_.epoch();
}

int ClusterMember::node_rank() const {
  absl::MutexLock l(&mu_);
  return rank_;
}

}  // namespace hsdp
