#include "daemon/cluster/member_view.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {

bool MemberView::Valid(const v1::ClusterNode& n) const {
  if (n.node_rank() >= 0 && static_cast<uint32_t>(n.node_rank()) < size_) return true;
  HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: the store sent node rank " << n.node_rank()
                                 << ", outside 0.." << size_ - 1 << "; entry ignored";
  return false;
}

void MemberView::Diff(const Known* before, const v1::ClusterNode& n, uint64_t epoch,
                      bool in_delta, std::vector<PeerEvent>* out) const {
  bool was_alive = false;
  std::string old_instance;
  if (before != nullptr) {
    was_alive = before->node.state() == "alive";
    old_instance = before->node.instance();
  } else if (in_delta && !awaited_[n.node_rank()] && !IsFirstJoin(n)) {
    // Never heard of (a sparse view), and news: it was alive until now, as
    // its previous instance.
    was_alive = true;
    old_instance = n.previous_instance();
  }
  const bool is_alive = n.state() == "alive";
  const bool restarted = was_alive && is_alive && old_instance != n.instance();
  if ((was_alive && !is_alive) || restarted) {
    out->push_back({PeerEvent::Kind::kLost, n.node_rank(),
                    absl::StrCat("node ", n.node_rank(), " (", n.address(), ") ",
                                 restarted ? "restarted" : absl::StrCat("was lost (", lost_why_, ")"),
                                 "; cluster epoch ", epoch),
                    restarted ? old_instance : std::string()});
  }
  if ((!was_alive && is_alive) || restarted) {
    out->push_back({PeerEvent::Kind::kJoined, n.node_rank(),
                    absl::StrCat("node ", n.node_rank(), " (", n.address(),
                                 ") joined; cluster epoch ", epoch),
                    std::string()});
  }
}

void MemberView::Track(const std::vector<PeerEvent>& events) {
  for (const PeerEvent& e : events) {
    if (e.node < 0 || static_cast<uint32_t>(e.node) >= size_) continue;
    const bool lost = e.kind == PeerEvent::Kind::kLost;
    if (awaited_[e.node] == lost) continue;
    awaited_[e.node] = lost;
    lost ? ++awaited_count_ : --awaited_count_;
  }
}

void MemberView::Merge(const v1::ClusterNode& n, uint64_t epoch, int self, absl::Time now,
                       std::vector<PeerEvent>* out) {
  auto it = nodes_.find(n.node_rank());
  if (n.node_rank() != self) {
    Diff(it == nodes_.end() ? nullptr : &it->second, n, epoch, /*in_delta=*/true, out);
  }
  nodes_[n.node_rank()] = {n, now};
}

std::vector<PeerEvent> MemberView::Apply(uint64_t epoch, const Nodes& nodes, bool delta,
                                         int self, absl::Time now) {
  std::vector<PeerEvent> events;
  std::map<int, Known> replaced;
  for (const v1::ClusterNode& n : nodes) {
    if (!Valid(n)) continue;
    if (delta) {
      Merge(n, epoch, self, now, &events);
      continue;
    }
    auto it = nodes_.find(n.node_rank());
    if (n.node_rank() != self) {
      Diff(it == nodes_.end() ? nullptr : &it->second, n, epoch, /*in_delta=*/false, &events);
    }
    replaced[n.node_rank()] = {n, now};
  }
  if (!delta) {
    nodes_.swap(replaced);
    stale_ = false;
  }
  epoch_ = epoch;
  last_answer_ = now;
  Track(events);
  return events;
}

std::vector<PeerEvent> MemberView::Alive(v1::ClusterNode n, uint64_t epoch, int self,
                                         absl::Time now) {
  std::vector<PeerEvent> events;
  if (!Valid(n)) return events;
  n.set_state("alive");
  Merge(n, epoch, self, now, &events);
  Track(events);
  return events;
}

std::vector<PeerEvent> MemberView::Lost(int rank, uint64_t epoch, int self, absl::Time now) {
  std::vector<PeerEvent> events;
  auto it = nodes_.find(rank);
  if (it == nodes_.end() || it->second.node.state() != "alive") return events;
  v1::ClusterNode n = it->second.node;
  n.set_state("lost");
  n.set_last_heartbeat_age_s(0);
  Merge(n, epoch, self, now, &events);
  Track(events);
  return events;
}

std::vector<PeerEvent> MemberView::Present(const std::vector<v1::ClusterNode>& alive,
                                           uint64_t epoch, int self, absl::Time now) {
  std::vector<PeerEvent> events;
  std::set<int> present;
  for (const v1::ClusterNode& n : alive) {
    if (!Valid(n)) continue;
    present.insert(n.node_rank());
    v1::ClusterNode a = n;
    a.set_state("alive");
    Merge(a, epoch, self, now, &events);
  }
  std::vector<int> gone;
  for (const auto& [rank, k] : nodes_) {
    if (k.node.state() == "alive" && !present.contains(rank)) gone.push_back(rank);
  }
  Track(events);
  for (int rank : gone) {
    std::vector<PeerEvent> lost = Lost(rank, epoch, self, now);  // tracked
    events.insert(events.end(), lost.begin(), lost.end());
  }
  last_answer_ = now;
  return events;
}

std::vector<PeerEvent> MemberView::LoseAll(int self, absl::string_view cause, absl::Time now) {
  std::vector<PeerEvent> events;
  for (auto& [rank, k] : nodes_) {
    if (rank == self || k.node.state() != "alive") continue;
    events.push_back({PeerEvent::Kind::kLost, rank,
                      absl::StrCat(cause, " and joins again; node ", rank, " (",
                                   k.node.address(), ") is treated as lost meanwhile"),
                      std::string()});
    k.node.set_state("lost");
    k.node.set_last_heartbeat_age_s(0);
    k.received = now;
  }
  Track(events);
  if (sparse_) {
    size_t unheard = 0;
    for (uint32_t r = 0; r < size_; ++r) {
      if (static_cast<int>(r) == self || awaited_[r] || nodes_.contains(r)) continue;
      awaited_[r] = true;
      ++awaited_count_;
      ++unheard;
    }
    if (unheard > 0) {
      events.push_back({PeerEvent::Kind::kLost, PeerEvent::kUnheardNodes,
                        absl::StrCat(cause, " and joins again; the ", unheard,
                                     " node rank(s) it had not heard of are treated as lost "
                                     "meanwhile"),
                        std::string()});
    }
  }
  stale_ = true;
  return events;
}

int MemberView::LiveSuccessor(int rank) const {
  auto it = nodes_.upper_bound(rank);
  for (size_t seen = 0; seen < nodes_.size(); ++seen, ++it) {
    if (it == nodes_.end()) it = nodes_.begin();
    if (it->first == rank) return -1;
    if (it->second.node.state() == "alive") return it->first;
  }
  return -1;
}

int MemberView::LivePredecessor(int rank) const {
  auto it = nodes_.lower_bound(rank);
  for (size_t seen = 0; seen < nodes_.size(); ++seen) {
    if (it == nodes_.begin()) it = nodes_.end();
    --it;
    if (it->first == rank) return -1;
    if (it->second.node.state() == "alive") return it->first;
  }
  return -1;
}

const v1::ClusterNode* MemberView::Find(int rank) const {
  auto it = nodes_.find(rank);
  return it == nodes_.end() ? nullptr : &it->second.node;
}

void MemberView::Fill(v1::NodesResponse* r, int self, absl::Time now) const {
  for (const auto& [rank, k] : nodes_) {
    const v1::ClusterNode& n = k.node;
    v1::NodeStatus* s = r->add_nodes();
    s->set_node_rank(rank);
    s->set_address(n.address());
    s->set_data_address(n.data_address());
    s->set_name(n.name());
    s->set_state(n.state());
    const bool vouched = n.state() == "alive" && k.received < last_answer_;
    s->set_last_heartbeat_age_s(vouched ? absl::ToDoubleSeconds(now - last_answer_)
                                        : n.last_heartbeat_age_s() +
                                              absl::ToDoubleSeconds(now - k.received));
    s->set_self(rank == self);
  }
}

void MemberView::AddUnheard(const v1::ListResponse& list, v1::NodesResponse* r) const {
  for (const v1::ClusterNode& n : list.nodes()) {
    if (n.node_rank() < 0 || static_cast<uint32_t>(n.node_rank()) >= size_ ||
        nodes_.contains(n.node_rank())) {
      continue;
    }
    const bool applied = n.changed_epoch() <= epoch_;
    if (!applied && IsFirstJoin(n)) continue;
    v1::NodeStatus* s = r->add_nodes();
    s->set_node_rank(n.node_rank());
    s->set_address(n.address());
    s->set_data_address(n.data_address());
    s->set_name(n.name());
    s->set_state(applied ? n.state() : "alive");
    s->set_last_heartbeat_age_s(n.last_heartbeat_age_s());
  }
  std::sort(r->mutable_nodes()->begin(), r->mutable_nodes()->end(),
            [](const v1::NodeStatus& a, const v1::NodeStatus& b) {
              return a.node_rank() < b.node_rank();
            });
}

v1::NodesResponse MemberView::Response(const MemberStatus& status, int self,
                                       const std::string& store, bool is_coordinator,
                                       absl::Time now) const {
  v1::NodesResponse r;
  r.set_enabled(true);
  status.FillView(&r, now);
  r.set_epoch(epoch_);
  r.set_node_rank(self);
  r.set_coordinator(store);
  r.set_is_coordinator(is_coordinator);
  r.set_expected_nodes(size_);
  Fill(&r, self, now);
  return r;
}

}  // namespace hsdp
