// One published epoch of the coordinator's node table: every node entry
// with the epoch in which it last changed. Immutable once built, so the
// coordinator hands the same std::shared_ptr<const NodeSnapshot> to every
// answer of that epoch and copies entries into responses outside its lock.
//
// An entry here carries no heartbeat age (that changes between epochs); the
// coordinator sets ages as it answers. Thread-safe (const after Next).
//
// News: an entry is news unless it is a first join (IsFirstJoin,
// membership.h). Deltas for members that keep sparse views
// (HeartbeatRequest.news_only) come from a second order that holds only
// news, so such a delta costs O(entries appended + log nodes) too.
#ifndef HSDP_DAEMON_CLUSTER_NODE_SNAPSHOT_H_
#define HSDP_DAEMON_CLUSTER_NODE_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/cluster/membership.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

class NodeSnapshot {
 public:
  // Epoch 0 with no entries, for ranks 0..nodes-1.
  explicit NodeSnapshot(uint32_t nodes) : entries_(nodes) {}

  uint64_t epoch() const { return epoch_; }

  // This snapshot with `changes` (whole entries; node_rank within range, a
  // rank at most once) published as epoch `epoch` (> epoch()): their
  // changed epoch is `epoch`. O(nodes + changes log changes).
  std::shared_ptr<const NodeSnapshot> Next(uint64_t epoch,
                                           std::vector<v1::ClusterNode> changes) const;

  // Appends, in rank order, every entry (`changed_after` 0) or those that
  // changed in an epoch after `changed_after`, at most `max_entries` of
  // them in whole epochs (all of the first epoch's when it alone has more).
  // Returns the epoch up to which the entries appended bring a holder of
  // `changed_after`'s list: epoch() unless entries were left out (they come
  // with a later call from the returned epoch). O(entries appended + log
  // nodes): nothing to do while the epoch stands still.
  // With `news_only`, only the entries that are news (first joins left out;
  // the epoch returned is the same).
  uint64_t Fill(uint64_t changed_after, size_t max_entries,
                google::protobuf::RepeatedPtrField<v1::ClusterNode>* out,
                bool news_only = false) const;


  // The entry of `rank`, null when no node held it yet (or out of range).
  const v1::ClusterNode* Find(int rank) const;

 private:
  struct Entry {
    bool used = false;
    uint64_t changed_epoch = 0;
    v1::ClusterNode node;
  };

  uint64_t epoch_ = 0;
  std::vector<Entry> entries_;  // by rank
  // The used ranks, ascending by (changed_epoch, rank): a delta is a suffix.
  std::vector<int32_t> by_change_;
  // The same order, news only.
  std::vector<int32_t> news_by_change_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_NODE_SNAPSHOT_H_
