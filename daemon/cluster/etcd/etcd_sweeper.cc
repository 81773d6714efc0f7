#include "daemon/cluster/etcd/etcd_sweeper.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp::etcd {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(2);
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

}  // namespace

EtcdSweeper::EtcdSweeper(EtcdClient* etcd, EtcdJoin* join, std::string prefix, uint32_t nodes,
                         std::atomic<uint64_t>* rpcs)
    : etcd_(etcd), join_(join), keys_(std::move(prefix)), nodes_(nodes), rpcs_(rpcs) {}

bool EtcdSweeper::stopping() const {
  absl::MutexLock l(&mu_);
  return stopping_;
}

size_t EtcdSweeper::tracked() const {
  absl::MutexLock l(&mu_);
  return live_.size();
}

void EtcdSweeper::Stop() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
  if (watch_ != nullptr) watch_->Cancel();
}

bool EtcdSweeper::Publish(int rank, const Held& held, int64_t holder_revision, uint64_t epoch) {
  v1::ClusterNode news;
  news.set_node_rank(rank);
  news.set_address(held.address);
  news.set_instance(held.instance);
  news.set_state("lost");
  news.set_changed_epoch(epoch);
  Count();
  // Only while the rank is free and its holder record is the lost
  // instance's: a node that took the rank since published its own news.
  absl::StatusOr<TxnResult> t = etcd_->Txn(
      {Compare::Unchanged(keys_.Node(rank), 0), Compare::Unchanged(keys_.RankOf(rank), holder_revision)},
      {Op::Put(keys_.NewsOf(rank), news.SerializeAsString())}, {}, kCallTimeout);
  if (!t.ok()) {
    // The next sweep from the start (Run) publishes it.
    HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: cannot publish the loss of node " << rank
                                     << ": " << t.status().message();
    return false;
  }
  if (t->succeeded) published_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool EtcdSweeper::Start(int64_t* from) {
  Count();
  absl::StatusOr<TxnResult> read = etcd_->Txn(
      {}, {Op::Get(keys_.Nodes(), PrefixEnd(keys_.Nodes())),
           Op::Get(keys_.Ranks(), PrefixEnd(keys_.Ranks())),
           Op::Get(keys_.News(), PrefixEnd(keys_.News()))},
      {}, kCallTimeout);
  if (!read.ok() || read->ranges.size() != 3) return false;
  auto valid = [this](int rank) { return rank >= 0 && rank < static_cast<int>(nodes_); };
  std::map<int, Held> live;
  for (const KeyValue& kv : read->ranges[0]) {
    const int rank = EtcdKeys::RankIn(kv.key, keys_.Nodes());
    v1::ClusterNode n;
    if (!valid(rank) || kv.value.size() > EtcdJoin::kMaxNodeValue || !n.ParseFromString(kv.value)) {
      continue;
    }
    live[rank] = {n.address(), n.instance(), kv.mod_revision};
  }
  std::map<int, v1::ClusterNode> news;
  for (const KeyValue& kv : read->ranges[2]) {
    const int rank = EtcdKeys::RankIn(kv.key, keys_.News());
    v1::ClusterNode n;
    if (valid(rank) && kv.value.size() <= EtcdJoin::kMaxNodeValue && n.ParseFromString(kv.value)) {
      news[rank] = std::move(n);
    }
  }
  // Ranks held once, not live now, whose last holder nobody published lost.
  std::vector<std::pair<int, Held>> unpublished;
  for (const KeyValue& kv : read->ranges[1]) {
    const int rank = EtcdKeys::RankIn(kv.key, keys_.Ranks());
    if (!valid(rank) || live.contains(rank)) continue;
    std::optional<v1::ClusterNode> holder = EtcdJoin::ParseHolder(kv.value);
    if (!holder.has_value()) continue;
    auto it = news.find(rank);
    if (it != news.end() && it->second.state() == "lost" &&
        it->second.instance() == holder->instance()) {
      continue;
    }
    unpublished.push_back({rank, {holder->address(), holder->instance(), kv.mod_revision}});
  }
  if (!unpublished.empty()) {
    HSDP_LOG(Info) << "cluster: sweeper: publishing " << unpublished.size()
                   << " loss(es) no sweeper published";
    const int64_t epoch = join_->AdvanceEpochPast(read->revision);
    for (const auto& [rank, held] : unpublished) {
      if (!Publish(rank, held, held.revision, static_cast<uint64_t>(std::max<int64_t>(epoch, 0)))) {
        return false;  // read again and publish what is still unpublished
      }
    }
  }
  absl::MutexLock l(&mu_);
  live_ = std::move(live);
  *from = read->revision + 1;
  return true;
}

void EtcdSweeper::Run() {
  int64_t from = 0;
  bool fresh = true;  // read everything first
  while (!stopping()) {
    if (fresh && !Start(&from)) {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRetryPause);
      continue;
    }
    fresh = false;
    Count();
    absl::StatusOr<std::unique_ptr<Watch>> watch =
        etcd_->StartWatch(keys_.Nodes(), PrefixEnd(keys_.Nodes()), from, kCallTimeout);
    absl::Status status = watch.status();
    if (watch.ok()) {
      {
        absl::MutexLock l(&mu_);
        if (stopping_) return;
        watch_ = watch->get();
      }
      std::vector<WatchEvent> events;
      while (status.ok()) {
        events.clear();
        status = (*watch)->Next(&events, absl::Now() + absl::Milliseconds(500));
        std::vector<std::pair<int, Held>> lost;
        int64_t lost_at = 0;
        {
          absl::MutexLock l(&mu_);
          for (const WatchEvent& e : events) {
            from = std::max(from, e.kv.mod_revision + 1);
            const int rank = EtcdKeys::RankIn(e.kv.key, keys_.Nodes());
            if (rank < 0 || rank >= static_cast<int>(nodes_)) continue;
            if (e.type == WatchEvent::Type::kPut) {
              v1::ClusterNode n;
              if (e.kv.value.size() <= EtcdJoin::kMaxNodeValue && n.ParseFromString(e.kv.value)) {
                live_[rank] = {n.address(), n.instance(), e.kv.mod_revision};
              }
              continue;
            }
            auto it = live_.find(rank);
            if (it == live_.end()) continue;
            lost.push_back({rank, std::move(it->second)});
            live_.erase(it);
            lost_at = std::max(lost_at, e.kv.mod_revision);
          }
          if (stopping_) status = absl::CancelledError("stopping");
        }
        if (!lost.empty()) {
          // One step for the losses of one batch, then their news.
          const int64_t epoch = join_->AdvanceEpochPast(lost_at);
          const uint64_t before = published();
          bool all = true;
          for (const auto& [rank, held] : lost) {
            all = Publish(rank, held, held.revision,
                          static_cast<uint64_t>(std::max<int64_t>(epoch, 0))) && all;
          }
          if (!all) status = absl::UnavailableError("a loss could not be published");
          HSDP_LOG(Info) << "cluster: sweeper: " << lost.size() << " node key(s) gone, "
                         << published() - before << " loss(es) published (epoch " << epoch
                         << ")";
        }
      }
      absl::MutexLock l(&mu_);
      watch_ = nullptr;
      if (stopping_) return;
    }
    // A compacted watch, or etcd trouble (a loss whose news could not be
    // published): read everything again.
    fresh = true;
    HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: sweeper: " << status.message()
                                     << "; reading the membership again";
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRetryPause);
  }
}

}  // namespace hsdp::etcd
