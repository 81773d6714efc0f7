// The node list a ClusterMember holds, and how the coordinator's answers
// change it: a whole list replaces it, a delta (HeartbeatResponse.
// nodes_delta) is merged by rank. Each difference for a peer (lost, joined,
// restarted) becomes a PeerEvent. The work per answer is O(entries in it
// × log nodes): a heartbeat answer with no change costs O(1).
//
// Ages (Fill): an entry's age is the coordinator's figure plus the time
// since it arrived, except for an alive entry that did not arrive in the
// latest answer: that answer vouched for it (the coordinator counts it
// alive, or it would have been in the delta), so its age is the time since
// that answer. Either way ages keep growing while the coordinator is silent.
//
// Entries whose rank is outside 0..nodes-1 are dropped (logged): the
// answer comes from a peer. Not thread-safe: ClusterMember guards it.
#ifndef HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_
#define HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"
#include "daemon/cluster/membership.h"
#include "hsdp/v1/admin.pb.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

class MemberView {
 public:
  using Nodes = google::protobuf::RepeatedPtrField<v1::ClusterNode>;

  explicit MemberView(uint32_t nodes) : size_(nodes) {}

  // The answer at `now` carries the whole list of `epoch` (`delta` false),
  // or the entries changed after nodes_epoch() (`delta` true). Returns the
  // events for the peers of node `self`.
  std::vector<PeerEvent> Apply(uint64_t epoch, const Nodes& nodes, bool delta, int self,
                               absl::Time now);
  // Forgets the list (the node joins again), keeping the epoch; returns the
  // peers of `self` that were alive.
  std::vector<v1::ClusterNode> Clear(int self);

  uint64_t epoch() const { return epoch_; }
  // What a heartbeat names as nodes_epoch: 0 while no list is held.
  uint64_t nodes_epoch() const { return nodes_.empty() ? 0 : epoch_; }
  size_t size() const { return nodes_.size(); }
  // Appends the nodes to `r` with their ages at `now`.
  void Fill(v1::NodesResponse* r, int self, absl::Time now) const;

 private:
  struct Known {
    v1::ClusterNode node;
    absl::Time received;
  };
  bool Valid(const v1::ClusterNode& n) const;
  // Appends the events of `after` replacing `before` (null: none).
  static void Diff(const Known* before, const v1::ClusterNode& after, uint64_t epoch,
                   std::vector<PeerEvent>* out);

  const uint32_t size_;
  uint64_t epoch_ = 0;
  std::map<int, Known> nodes_;  // by rank
  absl::Time last_answer_ = absl::InfinitePast();
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_
