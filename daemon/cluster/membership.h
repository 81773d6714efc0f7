// This daemon's membership in the cluster, whichever store keeps it
// (cluster.store): the coordinator's (ClusterMember: join, heartbeats) or
// etcd's (EtcdMember: a leased key per node, a watch). Both give the node a
// rank, keep a view of the nodes and the cluster's epoch, turn differences
// between views into PeerEvents, and relay group events (a cross-node
// group's epoch failed on one node) to every other node.
#ifndef HSDP_DAEMON_CLUSTER_MEMBERSHIP_H_
#define HSDP_DAEMON_CLUSTER_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "hsdp/v1/admin.pb.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

struct PeerEvent {
  enum class Kind { kJoined, kLost };
  // `node` of a kLost that concerns every node this member has not heard of
  // (a sparse view joining again: MemberView::LoseAll).
  static constexpr int kUnheardNodes = -1;
  Kind kind;
  int node;
  std::string why;
  // kLost of a node seen alive again in the same view with another instance
  // (its daemon restarted; a kJoined for it follows at once): the instance
  // that was lost. Empty otherwise.
  std::string old_instance;
};
using PeerEvents = std::function<void(const PeerEvent&)>;

// A first join: an alive entry whose rank had no holder before (no
// previous_instance). No group can span a node before it joined, so a
// member with a sparse view does without it (HeartbeatRequest.news_only);
// every other entry that changed is news to every member.
inline bool IsFirstJoin(const v1::ClusterNode& n) {
  return n.state() == "alive" && n.previous_instance().empty();
}
// A group event another node reported.
using GroupEvents = std::function<void(const v1::GroupEvent&)>;

class Membership {
 public:
  virtual ~Membership() = default;

  // Joins (retrying transient failures until cluster.join_timeout_ms), then
  // keeps the membership alive in the background. Errors that retrying cannot
  // fix (credentials, a rank conflict, a full cluster) end it at once.
  virtual absl::Status Start() = 0;
  // Idempotent; also ends a Start in progress (CANCELLED).
  virtual void Stop() = 0;
  // Queues `event` for the other nodes (never blocks; bounded, the oldest
  // dropped with a log line).
  virtual void ReportGroupEvent(v1::GroupEvent event) = 0;
  // What this member knows of the nodes (a sparse view holds the nodes it
  // heard of: see MemberView).
  virtual v1::NodesResponse View() const = 0;
  // The view for `hsdpctl nodes`: every node (a member with a sparse view
  // asks its store; View() when the store cannot answer).
  virtual v1::NodesResponse ClusterView() const { return View(); }
  virtual uint64_t epoch() const = 0;
  virtual int node_rank() const = 0;
  // This daemon's instance id (random per start; what the others' views
  // show for this node).
  virtual std::string instance() const = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_MEMBERSHIP_H_
