#include "daemon/cluster/node_snapshot.h"

#include <algorithm>

namespace hsdp {

std::shared_ptr<const NodeSnapshot> NodeSnapshot::Next(
    uint64_t epoch, std::vector<v1::ClusterNode> changes) const {
  auto next = std::make_shared<NodeSnapshot>(*this);
  next->epoch_ = epoch;
  std::sort(changes.begin(), changes.end(),
            [](const v1::ClusterNode& a, const v1::ClusterNode& b) {
              return a.node_rank() < b.node_rank();
            });
  std::vector<int32_t> changed;
  changed.reserve(changes.size());
  for (v1::ClusterNode& n : changes) {
    Entry& e = next->entries_[n.node_rank()];
    e.used = true;
    e.changed_epoch = epoch;
    e.node = std::move(n);
    changed.push_back(e.node.node_rank());
  }
  // The changed ranks leave their place in the orders and go to their end.
  auto changed_now = [&](int32_t rank) { return next->entries_[rank].changed_epoch == epoch; };
  std::erase_if(next->by_change_, changed_now);
  std::erase_if(next->news_by_change_, changed_now);
  next->by_change_.insert(next->by_change_.end(), changed.begin(), changed.end());
  for (int32_t rank : changed) {
    if (!IsFirstJoin(next->entries_[rank].node)) next->news_by_change_.push_back(rank);
  }
  return next;
}

uint64_t NodeSnapshot::Fill(uint64_t changed_after, size_t max_entries,
                            google::protobuf::RepeatedPtrField<v1::ClusterNode>* out,
                            bool news_only) const {
  if (changed_after >= epoch_) return epoch_;
  auto changed_by = [&](uint64_t e) {
    return [this, e](int32_t rank) { return entries_[rank].changed_epoch <= e; };
  };
  const std::vector<int32_t>& order = news_only ? news_by_change_ : by_change_;
  const auto first =
      std::partition_point(order.begin(), order.end(), changed_by(changed_after));
  auto last = order.end();
  uint64_t covered = epoch_;
  if (static_cast<size_t>(last - first) > max_entries) {
    // Cut before the epoch of the first entry that does not fit, or after
    // the first epoch when it alone does not fit.
    const uint64_t over = entries_[*(first + max_entries)].changed_epoch;
    last = std::partition_point(first, last, changed_by(over - 1));
    if (last == first) {
      last = std::partition_point(first, order.end(),
                                  changed_by(entries_[*first].changed_epoch));
    }
    covered = entries_[*(last - 1)].changed_epoch;
  }
  std::vector<int32_t> ranks(first, last);
  std::sort(ranks.begin(), ranks.end());
  out->Reserve(out->size() + static_cast<int>(ranks.size()));
  for (int32_t rank : ranks) {
    v1::ClusterNode* n = out->Add();
    *n = entries_[rank].node;
    n->set_changed_epoch(entries_[rank].changed_epoch);
  }
  return covered;
}

const v1::ClusterNode* NodeSnapshot::Find(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(entries_.size()) || !entries_[rank].used) {
    return nullptr;
  }
  return &entries_[rank].node;
}

}  // namespace hsdp
