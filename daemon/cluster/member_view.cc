#include "daemon/cluster/member_view.h"

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {

bool MemberView::Valid(const v1::ClusterNode& n) const {
  if (n.node_rank() >= 0 && static_cast<uint32_t>(n.node_rank()) < size_) return true;
  HSDP_LOG_EVERY_N_SEC(Error, 5) << "cluster: the coordinator sent node rank " << n.node_rank()
                                 << ", outside 0.." << size_ - 1 << "; entry ignored";
  return false;
}

void MemberView::Diff(const Known* before, const v1::ClusterNode& n, uint64_t epoch,
                      std::vector<PeerEvent>* out) {
  const bool was_alive = before != nullptr && before->node.state() == "alive";
  const bool is_alive = n.state() == "alive";
  const bool restarted = was_alive && is_alive && before->node.instance() != n.instance();
  if ((was_alive && !is_alive) || restarted) {
    out->push_back({PeerEvent::Kind::kLost, n.node_rank(),
                    absl::StrCat("node ", n.node_rank(), " (", n.address(), ") ",
                                 restarted ? "restarted" : "was lost (no heartbeat)",
                                 "; cluster epoch ", epoch),
                    restarted ? before->node.instance() : std::string()});
  }
  if ((!was_alive && is_alive) || restarted) {
    out->push_back({PeerEvent::Kind::kJoined, n.node_rank(),
                    absl::StrCat("node ", n.node_rank(), " (", n.address(),
                                 ") joined; cluster epoch ", epoch)});
  }
}

std::vector<PeerEvent> MemberView::Apply(uint64_t epoch, const Nodes& nodes, bool delta,
                                         int self, absl::Time now) {
  std::vector<PeerEvent> events;
  std::map<int, Known> replaced;
  for (const v1::ClusterNode& n : nodes) {
    if (!Valid(n)) continue;
    auto it = nodes_.find(n.node_rank());
    if (n.node_rank() != self) {
      Diff(it == nodes_.end() ? nullptr : &it->second, n, epoch, &events);
    }
    if (delta) {
      nodes_[n.node_rank()] = {n, now};
    } else {
      replaced[n.node_rank()] = {n, now};
    }
  }
  if (!delta) nodes_.swap(replaced);
  epoch_ = epoch;
  last_answer_ = now;
  return events;
}

std::vector<v1::ClusterNode> MemberView::Clear(int self) {
  std::vector<v1::ClusterNode> alive;
  for (const auto& [rank, k] : nodes_) {
    if (rank != self && k.node.state() == "alive") alive.push_back(k.node);
  }
  nodes_.clear();
  return alive;
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

}  // namespace hsdp
