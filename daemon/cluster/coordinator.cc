#include "daemon/cluster/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/jobs/cluster_directory.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

constexpr size_t kMaxFieldBytes = 512;

}  // namespace

Coordinator::Coordinator(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {
  nodes_.resize(options_.nodes);
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  monitor_ = std::thread([this] {
    const absl::Duration tick =
        std::max(absl::Milliseconds(5), absl::Milliseconds(options_.heartbeat_ms) / 4);
    absl::MutexLock l(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick)) {
      mu_.Unlock();
      CheckLiveness();
      mu_.Lock();
    }
  });
}

void Coordinator::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

uint64_t Coordinator::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

void Coordinator::FillNodes(google::protobuf::RepeatedPtrField<v1::ClusterNode>* out,
                            absl::Time now, uint64_t changed_after) const {
  for (size_t r = 0; r < nodes_.size(); ++r) {
    const Node& n = nodes_[r];
    if (!n.used || n.changed_epoch <= changed_after) continue;
    v1::ClusterNode* c = out->Add();
    c->set_node_rank(static_cast<int32_t>(r));
    c->set_address(n.address);
    c->set_data_address(n.data_address);
    c->set_name(n.name);
    c->set_state(n.alive ? "alive" : "lost");
    c->set_last_heartbeat_age_s(absl::ToDoubleSeconds(now - n.last_heartbeat));
    c->set_instance(n.instance);
  }
}

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const v1::JoinRequest& req) {
  if (req.address().empty() || req.instance().empty()) {
    return absl::InvalidArgumentError("a join must name the node's address and instance");
  }
  if (req.address().size() > kMaxFieldBytes || req.data_address().size() > kMaxFieldBytes ||
      req.name().size() > kMaxFieldBytes || req.instance().size() > kMaxFieldBytes) {
    return absl::InvalidArgumentError("join request fields are too long");
  }
  if (req.nodes() != options_.nodes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", req.address(), " has cluster.nodes ", req.nodes(), " but the coordinator has ",
        options_.nodes, "; every node must use the same value"));
  }
  const int requested = req.requested_rank();
  if (requested < -1 || requested >= static_cast<int>(options_.nodes)) {
    return absl::InvalidArgumentError(absl::StrCat("requested node rank ", requested,
                                                   " is out of range 0..", options_.nodes - 1));
  }
  if (requested == 0 && !options_.self_address.empty() &&
      req.address() != options_.self_address) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", req.address(), " asks for rank 0, which is the coordinator's (",
        options_.self_address, ")"));
  }
  absl::MutexLock l(&mu_);
  const absl::Time now = Now();
  int rank = -1;
  // A node that was here before (same address) gets its rank back.
  for (size_t r = 0; r < nodes_.size(); ++r) {
    if (nodes_[r].used && nodes_[r].address == req.address()) rank = static_cast<int>(r);
  }
  if (rank >= 0 && requested >= 0 && requested != rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", req.address(), " asks for rank ", requested, " but held rank ", rank,
        " before; fix cluster.node_rank or restart the coordinator"));
  }
  if (rank < 0 && requested >= 0) {
    const Node& n = nodes_[requested];
    if (n.used && n.alive) {
      return absl::AlreadyExistsError(absl::StrCat("node rank ", requested, " is held by ",
                                                   n.address, " (alive)"));
    }
    rank = requested;
  }
  if (rank < 0 && req.address() == options_.self_address &&
      !(nodes_[0].used && nodes_[0].alive)) {
    rank = 0;
  }
  if (rank < 0) {
    // The lowest free rank (0 is kept for the coordinator), else the lowest
    // rank of a lost node (its replacement).
    for (size_t r = 1; r < nodes_.size() && rank < 0; ++r) {
      if (!nodes_[r].used) rank = static_cast<int>(r);
    }
    for (size_t r = 0; r < nodes_.size() && rank < 0; ++r) {
      if (nodes_[r].used && !nodes_[r].alive) rank = static_cast<int>(r);
    }
    if (rank < 0 && options_.nodes == 1 && !nodes_[0].used) rank = 0;
  }
  if (rank < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the cluster is full: all ", options_.nodes, " node ranks are held by live nodes (",
        req.address(), " cannot join; check cluster.nodes)"));
  }
  Node& n = nodes_[rank];
  const bool changed = !n.used || !n.alive || n.instance != req.instance();
  epoch_ = std::max(epoch_, req.last_epoch());
  if (changed) {
    ++epoch_;
    n.changed_epoch = epoch_;
  }
  n.used = true;
  n.alive = true;
  n.address = req.address();
  n.data_address = req.data_address();
  n.name = req.name();
  n.instance = req.instance();
  n.last_heartbeat = now;
  if (changed) {
    HSDP_LOG(Info) << "cluster: node " << rank << " (" << n.address << ", " << n.name
                   << ") joined; epoch " << epoch_;
  }
  v1::JoinResponse resp;
  resp.set_node_rank(rank);
  resp.set_epoch(epoch_);
  resp.set_heartbeat_ms(options_.heartbeat_ms);
  resp.set_missed_heartbeats(options_.missed_heartbeats);
  resp.set_events_last(last_event_);
  FillNodes(resp.mutable_nodes(), now);
  return resp;
}

bool Coordinator::IsLiveLocked(int rank, const std::string& instance) const {
  return rank >= 0 && rank < static_cast<int>(nodes_.size()) && nodes_[rank].used &&
         nodes_[rank].alive && nodes_[rank].instance == instance;
}

absl::Status Coordinator::Report(const v1::ReportRequest& req) {
  if (static_cast<size_t>(req.events_size()) > kMaxReportEvents) {
    return absl::InvalidArgumentError(absl::StrCat("events: ", req.events_size(),
                                                   " in one report; the limit is ",
                                                   kMaxReportEvents));
  }
  for (const v1::GroupEvent& e : req.events()) {
    if (e.group_key().empty() || e.group_key().size() > kMaxEventField ||
        e.why().size() > kMaxEventField) {
      return absl::InvalidArgumentError(absl::StrCat(
          "events: group_key must be 1 to ", kMaxEventField, " bytes and why at most ",
          kMaxEventField, " bytes"));
    }
    if (e.epoch() < 1 || e.epoch() >= kMaxGroupEpoch) {
      return absl::InvalidArgumentError(absl::StrCat("events: epoch ", e.epoch(),
                                                     " is out of range [1, ", kMaxGroupEpoch,
                                                     ")"));
    }
  }
  absl::MutexLock l(&mu_);
  if (!IsLiveLocked(req.node_rank(), req.instance())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", req.node_rank(), " is not a live member of this cluster; join again"));
  }
  for (const v1::GroupEvent& in : req.events()) {
    v1::GroupEvent e = in;
    e.set_seq(++last_event_);
    e.set_origin_node(req.node_rank());
    events_.push_back(std::move(e));
    while (events_.size() > kMaxEventLog) events_.pop_front();
  }
  return absl::OkStatus();
}

void Coordinator::FillEvents(uint64_t after, v1::HeartbeatResponse* resp) const {
  // A cursor from before a coordinator restart (beyond our log) starts over.
  if (after > last_event_) after = 0;
  resp->set_events_last(last_event_);
  if (after == last_event_) return;
  const uint64_t first = events_.empty() ? last_event_ + 1 : events_.front().seq();
  resp->set_events_missed(after + 1 < first);
  size_t n = 0;
  for (const v1::GroupEvent& e : events_) {
    if (e.seq() <= after) continue;
    if (n++ == kMaxEventsPerHeartbeat) {
      resp->set_events_last(e.seq() - 1);  // the rest on the next heartbeat
      break;
    }
    *resp->add_events() = e;
  }
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::MutexLock l(&mu_);
  const int rank = req.node_rank();
  if (!IsLiveLocked(rank, req.instance())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", rank, " is not a live member of this cluster (declared lost, or the "
        "coordinator restarted); join again"));
  }
  const absl::Time now = Now();
  nodes_[rank].last_heartbeat = now;
  v1::HeartbeatResponse resp;
  resp.set_epoch(epoch_);
  // A node that holds the list of an epoch of this coordinator (it joined
  // here, so its epoch is one of ours) gets what changed since: nothing in
  // the steady state. Any other gets the whole list.
  const uint64_t known = req.nodes_epoch();
  if (known != 0 && known <= epoch_) {
    resp.set_nodes_delta(true);
    if (known < epoch_) FillNodes(resp.mutable_nodes(), now, known);
  } else {
    FillNodes(resp.mutable_nodes(), now);
  }
  FillEvents(req.events_after(), &resp);
  return resp;
}

void Coordinator::CheckLiveness() {
  const absl::Time now = Now();
  const absl::Duration limit =
      absl::Milliseconds(uint64_t{options_.heartbeat_ms} * options_.missed_heartbeats);
  absl::MutexLock l(&mu_);
  for (size_t r = 0; r < nodes_.size(); ++r) {
    Node& n = nodes_[r];
    if (!n.used || !n.alive || now - n.last_heartbeat <= limit) continue;
    n.alive = false;
    ++epoch_;
    n.changed_epoch = epoch_;
    HSDP_LOG(Warning) << "cluster: node " << r << " (" << n.address << ") lost: no heartbeat for "
                      << absl::FormatDuration(now - n.last_heartbeat) << "; epoch " << epoch_;
  }
}

}  // namespace hsdp
