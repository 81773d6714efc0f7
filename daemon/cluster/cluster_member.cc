#include "daemon/cluster/cluster_member.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {
ClusterMember::ClusterMember(Options options, PeerEvents events, GroupEvents group_events)
    : options_(std::move(options)), events_(std::move(events)),
      group_events_(std::move(group_events)), instance_(NewInstanceId()),
      client_(options_.coordinator, options_.token, options_.credentials),
      view_(options_.nodes), outbox_(kMaxOutbox, "the coordinator") {}

ClusterMember::~ClusterMember() { Stop(); }

absl::Status ClusterMember::JoinOnce(absl::Duration timeout) {
  v1::JoinRequest req;
  req.set_address(options_.address);
  req.set_data_address(options_.data_address);
  req.set_name(options_.name);
  req.set_requested_rank(options_.node_rank);
  req.set_nodes(options_.nodes);
  req.set_instance(instance_);
  req.set_last_epoch(epoch());
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
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  absl::Status last;
  for (int attempt = 0;; ++attempt) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return absl::CancelledError("cluster: stopped while joining");
    }
    // Short attempts, so Stop (SIGTERM) ends a join within about a second.
    last = JoinOnce(std::min(left, absl::Seconds(1)));
    if (last.ok()) break;
    if (PermanentJoinError(last)) {
      absl::MutexLock l(&mu_);
      status_.Failed(last);
      return absl::Status(last.code(), absl::StrCat("cannot join the cluster: ", last.message()));
    }
    if (attempt % 10 == 0) {
      HSDP_LOG(Info) << "cluster: waiting for the coordinator " << options_.coordinator << " ("
                     << last.message() << ")";
    }
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                         std::min(absl::Milliseconds(200), std::max(absl::ZeroDuration(), left)));
  }
  if (!last.ok()) {
    absl::MutexLock l(&mu_);
    status_.Failed(last);
    return absl::DeadlineExceededError(absl::StrCat(
        "cannot join the cluster: the coordinator ", options_.coordinator,
        " did not accept this node within cluster.join_timeout_ms (",
        absl::ToInt64Milliseconds(options_.join_timeout), " ms); last error: ", last.message()));
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

void ClusterMember::HeartbeatLoop() {
  int failures = 0;
  bool degraded = false;
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
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<v1::HeartbeatResponse> r =
        client_.Heartbeat(req, std::max(options_.heartbeat, absl::Milliseconds(200)));
    absl::Status status = r.status();
    if (r.ok()) {
      Update(r->epoch(), r->nodes(), r->nodes_delta());
      Deliver(*r);
    } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
      // Declared lost, or a new coordinator: join again. The others failed
      // the epochs of every group shared with this node, so it does too.
      HSDP_LOG(Warning) << "cluster: " << status.message() << "; joining again";
      std::vector<PeerEvent> lost;
      {
        absl::MutexLock l(&mu_);
        for (const v1::ClusterNode& n : view_.Clear(rank_)) {
          lost.push_back({PeerEvent::Kind::kLost, n.node_rank(),
                          absl::StrCat("this node lost contact with the coordinator ",
                                       options_.coordinator, " (", status.message(),
                                       ") and joins again; node ", n.node_rank(), " (",
                                       n.address(), ") is treated as lost meanwhile")});
        }
      }
      FirePeerEvents(lost, events_);
      status = JoinOnce(std::max(options_.heartbeat, absl::Milliseconds(500)));
    }
    if (status.ok()) {
      if (degraded) {
        HSDP_LOG(Info) << "cluster: the coordinator " << options_.coordinator
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
          "the coordinator ", options_.coordinator, " has not answered ", failures,
          " heartbeats (", status.message(),
          "); membership is frozen, node losses are not detected, and new cross-node groups "
          "and attaches fail; restart the coordinator (see docs/cluster.md)");
      HSDP_LOG(Error) << "cluster degraded: " << detail;
      absl::MutexLock l(&mu_);
      status_.Degraded(detail);
    }
  }
}

v1::NodesResponse ClusterMember::View() const {
  absl::MutexLock l(&mu_);
  v1::NodesResponse r;
  r.set_enabled(true);
  const absl::Time now = absl::Now();
  status_.FillView(&r, now);
  r.set_epoch(view_.epoch());
  r.set_node_rank(rank_);
  r.set_coordinator(options_.coordinator);
  r.set_is_coordinator(options_.is_coordinator);
  r.set_expected_nodes(options_.nodes);
  view_.Fill(&r, rank_, now);
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
