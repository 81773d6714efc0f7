#include "daemon/cluster/cluster_member.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {
ClusterMember::ClusterMember(Options options, PeerEvents events, GroupEvents group_events)
    : options_(std::move(options)), events_(std::move(events)),
      group_events_(std::move(group_events)), instance_(NewInstanceId()),
      client_(options_.coordinator, options_.token, options_.credentials),
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
  req.set_last_epoch(epoch());
  rpcs_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<v1::JoinResponse> r = client_.Join(req, timeout);
  if (!r.ok()) return r.status();
  {
    absl::MutexLock l(&mu_);
    rank_ = r->node_rank();
    events_after_ = r->events_last();  // older events concern groups before this join
    status_.Contact(absl::Now());
  }
  Update(r->epoch(), {r->nodes().begin(), r->nodes().end()});
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

std::vector<v1::ClusterNode> ClusterMember::Merged(const v1::HeartbeatResponse& r) const {
  if (!r.nodes_delta()) return {r.nodes().begin(), r.nodes().end()};
  std::map<int, v1::ClusterNode> by_rank;
  {
    absl::MutexLock l(&mu_);
    for (const v1::ClusterNode& n : nodes_) {
      v1::ClusterNode& mine = by_rank[n.node_rank()];
      mine = n;
      // Alive in the coordinator's answer just now (an entry that changed
      // would be in the delta): its heartbeats are current.
      if (mine.state() == "alive") mine.set_last_heartbeat_age_s(0);
    }
  }
  for (const v1::ClusterNode& n : r.nodes()) by_rank[n.node_rank()] = n;
  std::vector<v1::ClusterNode> out;
  out.reserve(by_rank.size());
  for (auto& [rank, n] : by_rank) out.push_back(std::move(n));
  return out;
}

void ClusterMember::Update(uint64_t epoch, std::vector<v1::ClusterNode> nodes) {
  std::vector<PeerEvent> events;
  {
    absl::MutexLock l(&mu_);
    std::map<int, const v1::ClusterNode*> before;
    for (const v1::ClusterNode& n : nodes_) before[n.node_rank()] = &n;
    for (const v1::ClusterNode& n : nodes) {
      if (n.node_rank() == rank_) continue;
      auto it = before.find(n.node_rank());
      const bool was_alive = it != before.end() && it->second->state() == "alive";
      const bool is_alive = n.state() == "alive";
      const bool restarted = was_alive && is_alive && it->second->instance() != n.instance();
      if ((was_alive && !is_alive) || restarted) {
        events.push_back({PeerEvent::Kind::kLost, n.node_rank(),
                          absl::StrCat("node ", n.node_rank(), " (", n.address(), ") ",
                                       restarted ? "restarted" : "was lost (no heartbeat)",
                                       "; cluster epoch ", epoch),
                          restarted ? it->second->instance() : std::string()});
      }
      if ((!was_alive && is_alive) || restarted) {
        events.push_back({PeerEvent::Kind::kJoined, n.node_rank(),
                          absl::StrCat("node ", n.node_rank(), " (", n.address(),
                                       ") joined; cluster epoch ", epoch)});
      }
    }
    epoch_ = epoch;
    nodes_ = std::move(nodes);
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
      req.set_nodes_epoch(nodes_.empty() ? 0 : epoch_);
    }
    rpcs_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<v1::HeartbeatResponse> r =
        client_.Heartbeat(req, std::max(options_.heartbeat, absl::Milliseconds(200)));
    absl::Status status = r.status();
    if (r.ok()) {
      Update(r->epoch(), Merged(*r));
      Deliver(*r);
    } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
      // Declared lost, or a new coordinator: join again. The others failed
      // the epochs of every group shared with this node, so it does too.
      HSDP_LOG(Warning) << "cluster: " << status.message() << "; joining again";
      std::vector<PeerEvent> lost;
      {
        absl::MutexLock l(&mu_);
        for (const v1::ClusterNode& n : nodes_) {
          if (n.node_rank() == rank_ || n.state() != "alive") continue;
          lost.push_back({PeerEvent::Kind::kLost, n.node_rank(),
                          absl::StrCat("this node lost contact with the coordinator ",
                                       options_.coordinator, " (", status.message(),
                                       ") and joins again; node ", n.node_rank(), " (",
                                       n.address(), ") is treated as lost meanwhile")});
        }
        nodes_.clear();
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
  const double since_contact = status_.FillView(&r, absl::Now());
  r.set_epoch(epoch_);
  r.set_node_rank(rank_);
  r.set_coordinator(options_.coordinator);
  r.set_is_coordinator(options_.is_coordinator);
  r.set_expected_nodes(options_.nodes);
  for (const v1::ClusterNode& n : nodes_) {
    v1::NodeStatus* s = r.add_nodes();
    s->set_node_rank(n.node_rank());
    s->set_address(n.address());
    s->set_data_address(n.data_address());
    s->set_name(n.name());
    s->set_state(n.state());
    // The coordinator's figure plus the time since it answered, so the ages
    // keep growing while the coordinator is silent.
    s->set_last_heartbeat_age_s(n.last_heartbeat_age_s() + since_contact);
    s->set_self(n.node_rank() == rank_);
  }
  return r;
}

uint64_t ClusterMember::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

int ClusterMember::node_rank() const {
  absl::MutexLock l(&mu_);
  return rank_;
}

}  // namespace hsdp
