// The node list a member holds, whichever store it learns it from, and the
// one definition of how changes to it become PeerEvents: a peer alive that
// is no longer (lost), alive with another instance (restarted: lost, then
// joined), or alive that was not (joined).
//
// ClusterMember feeds it the coordinator's answers: a whole list replaces
// it, a delta (HeartbeatResponse.nodes_delta) is merged by rank. EtcdMember
// feeds it the node keys it reads or watches: a key put is the node alive
// (Alive), a key gone is the node lost (Lost), a read of every key is the
// set of live nodes (Present). The work is O(entries given × log nodes):
// an answer with no change costs O(1).
//
// Ages (Fill): an entry's age is the store's figure plus the time since it
// arrived, except for an alive entry older than the store's latest answer
// (Apply, Present or Vouch): that answer vouched for it (the coordinator
// counts it alive, or it would have been in the delta; its key is in etcd,
// or the watch would have said), so its age is the time since that answer.
// Either way ages keep growing while the store is silent.
//
// Rejoining (LoseAll): a member that learns it was declared lost treats
// every other node as lost until it joined again (the others failed the
// epochs of the groups they share with it); the entries stay, shown lost.
//
// Sparse views (ClusterMember; HeartbeatRequest.news_only): the member
// starts from a join answer without the list and hears of a rank only when
// it is news (lost, restarted, rejoined; not a first join, which no group
// can have depended on). A delta entry for a rank it never heard of is
// therefore read against "alive, as its previous_instance": lost is a
// loss, alive with a previous instance a restart (kLost naming that
// instance, then kJoined), alive without one a first join. A rank the member
// reported lost is awaited until it is alive again: while any is, the member
// asks for first joins too (news_only() false), since a node that comes
// back on a restarted coordinator comes back as a first join. LoseAll in a
// sparse view also reports the nodes it never heard of lost, in one event
// (node PeerEvent::kUnheardNodes), and awaits them.
//
// Entries whose rank is outside 0..nodes-1 are dropped (logged): they come
// from a peer. Not thread-safe: the member guards it.
#ifndef HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_
#define HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/cluster/member_status.h"
#include "daemon/cluster/membership.h"
#include "hsdp/v1/admin.pb.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

class MemberView {
 public:
  using Nodes = google::protobuf::RepeatedPtrField<v1::ClusterNode>;

  enum class Kind { kWhole, kSparse };
  // `lost_why` says in a loss event why a node counts as lost.
  explicit MemberView(uint32_t nodes, std::string lost_why = "no heartbeat",
                      Kind kind = Kind::kWhole)
      : size_(nodes), lost_why_(std::move(lost_why)), sparse_(kind == Kind::kSparse),
        awaited_(nodes, false) {}

  // The answer at `now` carries the whole list of `epoch` (`delta` false),
  // or the entries changed after nodes_epoch() (`delta` true). Returns the
  // events for the peers of node `self`.
  std::vector<PeerEvent> Apply(uint64_t epoch, const Nodes& nodes, bool delta, int self,
                               absl::Time now);
  // Node `n` (its rank set) is alive as of `now`; events for it, named
  // with `epoch`.
  std::vector<PeerEvent> Alive(v1::ClusterNode n, uint64_t epoch, int self, absl::Time now);
  // Node `rank` is gone (lost at `now`); the loss event when it was alive.
  std::vector<PeerEvent> Lost(int rank, uint64_t epoch, int self, absl::Time now);
  // `alive` (ranks set) are every live node at `now`: each is alive, every
  // other entry that was alive is lost.
  std::vector<PeerEvent> Present(const std::vector<v1::ClusterNode>& alive, uint64_t epoch,
                                 int self, absl::Time now);
  // The store answered at `now` without naming a change.
  void Vouch(absl::Time now) { last_answer_ = now; }
  // This node was declared lost and joins again: every other alive entry
  // becomes lost, and the kLost events say "`cause` and joins again; node r
  // (...) is treated as lost meanwhile". nodes_epoch() is 0 until a whole
  // list arrives.
  std::vector<PeerEvent> LoseAll(int self, absl::string_view cause, absl::Time now);

  // The next alive rank after `rank`, cyclically (not `rank` itself); -1
  // when none.
  int LiveSuccessor(int rank) const;
  // The alive rank before `rank`, cyclically (not `rank` itself); -1 when
  // none.
  int LivePredecessor(int rank) const;
  // The entry of `rank`, null when none.
  const v1::ClusterNode* Find(int rank) const;

  uint64_t epoch() const { return epoch_; }
  // A store whose epoch arrives apart from the list (etcd's epoch key):
  // the epoch moves to `epoch` unless it is already past it.
  void RaiseEpoch(uint64_t epoch) { epoch_ = std::max(epoch_, epoch); }
  // What a heartbeat names as nodes_epoch: 0 while no list is held.
  uint64_t nodes_epoch() const { return nodes_.empty() || stale_ ? 0 : epoch_; }
  // LoseAll since the last whole list: the next join asks for the list.
  bool stale() const { return stale_; }
  // A sparse view that awaits no rank: heartbeats may leave first joins out.
  bool news_only() const { return sparse_ && awaited_count_ == 0; }
  // Ranks reported lost and not alive since.
  size_t awaited() const { return awaited_count_; }
  size_t size() const { return nodes_.size(); }
  // Appends the nodes to `r` with their ages at `now`.
  void Fill(v1::NodesResponse* r, int self, absl::Time now) const;
  // Adds to `r` (a Response of this view) the ranks of `list` (the store's
  // whole list) this view never heard of, as this member counts them at its
  // epoch: an entry published at or before it as it is; a later one not
  // yet (a first join left out, news shown alive as its previous instance,
  // as the member presumes until its heartbeat brings it). Keeps `r`'s
  // nodes in rank order.
  void AddUnheard(const v1::ListResponse& list, v1::NodesResponse* r) const;
  // The answer to `hsdpctl nodes`: this node's `status`, rank `self`, the
  // epoch, the store (`store`, `is_coordinator`) and every node it holds.
  v1::NodesResponse Response(const MemberStatus& status, int self, const std::string& store,
                             bool is_coordinator, absl::Time now) const;

 private:
  struct Known {
    v1::ClusterNode node;
    absl::Time received;
  };
  bool Valid(const v1::ClusterNode& n) const;
  // Appends the events of `after` replacing `before` (null: none; in a
  // delta, `in_delta`, an unheard-of rank is read as the class comment
  // says).
  void Diff(const Known* before, const v1::ClusterNode& after, uint64_t epoch, bool in_delta,
            std::vector<PeerEvent>* out) const;
  // Records `n` at `now` (events into `out` unless it is `self`).
  void Merge(const v1::ClusterNode& n, uint64_t epoch, int self, absl::Time now,
             std::vector<PeerEvent>* out);
  // Marks the ranks of `events` awaited (kLost) or not (kJoined), in order.
  void Track(const std::vector<PeerEvent>& events);

  const uint32_t size_;
  const std::string lost_why_;
  uint64_t epoch_ = 0;
  std::map<int, Known> nodes_;  // by rank
  absl::Time last_answer_ = absl::InfinitePast();
  bool stale_ = false;  // LoseAll since the last whole list
  const bool sparse_;
  std::vector<bool> awaited_;  // by rank
  size_t awaited_count_ = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_MEMBER_VIEW_H_
