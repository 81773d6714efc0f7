#include "daemon/cluster/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/jobs/cluster_directory.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

constexpr size_t kMaxFieldBytes = 512;
// A last_epoch no cluster reaches (an epoch step per microsecond for 500
// years): beyond it a peer's value is refused, so next_epoch_ cannot wrap.
constexpr uint64_t kMaxEpoch = uint64_t{1} << 62;

// Puts `entry` into the rank-ordered `nodes`, replacing the entry of its rank.
void PutEntry(v1::ClusterNode entry, google::protobuf::RepeatedPtrField<v1::ClusterNode>* nodes) {
  int at = nodes->size();
  while (at > 0 && nodes->Get(at - 1).node_rank() >= entry.node_rank()) --at;
  if (at < nodes->size() && nodes->Get(at).node_rank() == entry.node_rank()) {
    *nodes->Mutable(at) = std::move(entry);
    return;
  }
  *nodes->Add() = std::move(entry);
  for (int i = nodes->size() - 1; i > at; --i) nodes->SwapElements(i, i - 1);
}

}  // namespace

Coordinator::Coordinator(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      heard_ns_(std::make_unique<std::atomic<int64_t>[]>(options_.nodes)) {
  nodes_.resize(options_.nodes);
  published_ = std::make_shared<const NodeSnapshot>(options_.nodes);
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void Coordinator::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

void Coordinator::MonitorLoop() {
  const absl::Duration heartbeat = absl::Milliseconds(options_.heartbeat_ms);
  // Liveness is checked every heartbeat / 20 (a loss is declared within
  // 5% of a heartbeat of the lease's end; the check is O(nodes) but a few
  // microseconds at 10,000).
  const absl::Duration tick =
      std::clamp(heartbeat / 20, absl::Milliseconds(5), absl::Milliseconds(250));
  const absl::Duration fold_in = std::min(kStepDelay, heartbeat / 4);
  absl::Time next_check = absl::Now() + tick;
  absl::MutexLock l(&mu_);
  for (;;) {
    mu_.AwaitWithDeadline(absl::Condition(this, &Coordinator::MonitorWakeLocked), next_check);
    if (stopping_) return;
    if (!pending_.empty()) {
      // A join is waiting for its step: fold in those that arrive meanwhile.
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), fold_in)) return;
      mu_.Unlock();
      Step();
      mu_.Lock();
    }
    if (absl::Now() >= next_check) {
      mu_.Unlock();
      CheckLiveness();
      mu_.Lock();
      next_check = absl::Now() + tick;
    }
  }
}

uint64_t Coordinator::epoch() const {
  absl::MutexLock l(&mu_);
  return published_->epoch();
}

void Coordinator::MarkChangedLocked(int rank) {
  if (nodes_[rank].pending) return;
  nodes_[rank].pending = true;
  pending_.push_back(rank);
}

v1::ClusterNode Coordinator::EntryLocked(int rank) const {
  const Node& n = nodes_[rank];
  v1::ClusterNode c;
  c.set_node_rank(rank);
  c.set_address(n.address);
  c.set_data_address(n.data_address);
  c.set_name(n.name);
  c.set_state(n.alive ? "alive" : "lost");
  c.set_instance(n.instance);
  c.set_previous_instance(n.previous_instance);
  return c;
}

void Coordinator::SetAges(google::protobuf::RepeatedPtrField<v1::ClusterNode>* nodes) const {
  const int64_t now = NowNs();
  for (v1::ClusterNode& n : *nodes) {
    const int64_t heard = heard_ns_[n.node_rank()].load(std::memory_order_relaxed);
    n.set_last_heartbeat_age_s(static_cast<double>(now - heard) / 1e9);
  }
}

void Coordinator::Step() {
  absl::MutexLock step(&step_mu_);
  std::vector<v1::ClusterNode> changes;
  uint64_t epoch;
  std::shared_ptr<const NodeSnapshot> base;
  {
    absl::MutexLock l(&mu_);
    if (pending_.empty()) return;
    changes.reserve(pending_.size());
    for (int rank : pending_) {
      changes.push_back(EntryLocked(rank));
      nodes_[rank].pending = false;
    }
    pending_.clear();
    epoch = next_epoch_++;
    base = published_;
  }
  // O(nodes), outside the table's lock; step_mu_ keeps steps in order.
  std::shared_ptr<const NodeSnapshot> next = base->Next(epoch, std::move(changes));
  absl::MutexLock l(&mu_);
  published_ = std::move(next);
}

absl::Status Coordinator::CheckJoinRequest(const v1::JoinRequest& req) const {
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
  if (req.last_epoch() >= kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("last_epoch ", req.last_epoch(),
                                                   " is out of range"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Coordinator::PickRankLocked(const v1::JoinRequest& req) const {
  const int requested = req.requested_rank();
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
  return rank;
}

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const v1::JoinRequest& req) {
  RETURN_IF_ERROR(CheckJoinRequest(req));
  int rank;
  bool catch_up;
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(rank, PickRankLocked(req));
    Node& n = nodes_[rank];
    const bool changed = !n.used || !n.alive || n.instance != req.instance();
    if (changed) n.previous_instance = n.used ? n.instance : std::string();
    n.used = true;
    n.alive = true;
    n.address = req.address();
    n.data_address = req.data_address();
    n.name = req.name();
    n.instance = req.instance();
    heard_ns_[rank].store(NowNs(), std::memory_order_relaxed);
    // A node that saw this epoch or a later one (a restarted coordinator
    // continues from it; the very first join, at epoch 0) must see the
    // epoch move past it: this join is published at once, above
    // last_epoch. (A node rejoining a coordinator that kept running saw an
    // earlier epoch: the one that declared it lost came after.)
    catch_up = req.last_epoch() >= published_->epoch();
    next_epoch_ = std::max(next_epoch_, req.last_epoch() + 1);
    if (changed || catch_up) MarkChangedLocked(rank);
    if (changed) {
      HSDP_LOG(Info) << "cluster: node " << rank << " (" << n.address << ", " << n.name
                     << ") joined; published after epoch " << published_->epoch();
    }
  }
  if (catch_up) Step();
  v1::JoinResponse resp;
  std::shared_ptr<const NodeSnapshot> snapshot;
  v1::ClusterNode self;
  {
    absl::MutexLock l(&mu_);
    snapshot = published_;
    self = EntryLocked(rank);
    resp.set_events_last(last_event_);
  }
  resp.set_node_rank(rank);
  resp.set_epoch(snapshot->epoch());
  resp.set_heartbeat_ms(options_.heartbeat_ms);
  resp.set_missed_heartbeats(options_.missed_heartbeats);
  if (!req.list_optional()) snapshot->Fill(0, SIZE_MAX, resp.mutable_nodes());
  PutEntry(std::move(self), resp.mutable_nodes());
  SetAges(resp.mutable_nodes());
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
  v1::HeartbeatResponse resp;
  std::shared_ptr<const NodeSnapshot> snapshot;
  {
    absl::MutexLock l(&mu_);
    const int rank = req.node_rank();
    if (!IsLiveLocked(rank, req.instance())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", rank, " is not a live member of this cluster (declared lost, or the "
          "coordinator restarted); join again"));
    }
    heard_ns_[rank].store(NowNs(), std::memory_order_relaxed);
    snapshot = published_;
    FillEvents(req.events_after(), &resp);
  }
  // A node that holds the list of an epoch of this coordinator (it joined
  // here, so its epoch is one of ours) gets what changed since, in pages
  // (only news with news_only): nothing in the steady state. Any other gets
  // the whole list.
  const uint64_t known = req.nodes_epoch();
  const bool delta = known != 0 && known <= snapshot->epoch();
  resp.set_nodes_delta(delta);
  resp.set_epoch(delta ? snapshot->Fill(known, options_.max_nodes_per_heartbeat,
                                        resp.mutable_nodes(), req.news_only())
                       : snapshot->Fill(0, SIZE_MAX, resp.mutable_nodes()));
  SetAges(resp.mutable_nodes());
  return resp;
}

v1::ListResponse Coordinator::List() const {
  std::shared_ptr<const NodeSnapshot> snapshot;
  {
    absl::MutexLock l(&mu_);
    snapshot = published_;
  }
  v1::ListResponse resp;
  resp.set_epoch(snapshot->Fill(0, SIZE_MAX, resp.mutable_nodes()));
  SetAges(resp.mutable_nodes());
  return resp;
}

void Coordinator::CheckLiveness() {
  const int64_t now = NowNs();
  const int64_t limit_ns =
      int64_t{options_.heartbeat_ms} * options_.missed_heartbeats * 1'000'000;
  bool lost = false;
  {
    absl::MutexLock l(&mu_);
    for (size_t r = 0; r < nodes_.size(); ++r) {
      Node& n = nodes_[r];
      const int64_t silent = now - heard_ns_[r].load(std::memory_order_relaxed);
      if (!n.used || !n.alive || silent <= limit_ns) continue;
      n.alive = false;
      MarkChangedLocked(static_cast<int>(r));
      lost = true;
      HSDP_LOG(Warning) << "cluster: node " << r << " (" << n.address
                        << ") lost: no heartbeat for "
                        << absl::FormatDuration(absl::Nanoseconds(silent));
    }
  }
  if (lost) Step();  // losses are not batched: the epoch moves now
}

}  // namespace hsdp
