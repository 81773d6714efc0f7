#include "daemon/cluster/etcd/etcd_join.h"

#include <algorithm>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hsdp::etcd {
namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::Milliseconds(1), deadline - absl::Now());
}

// A uniform double in [0, 1), per thread.
double Uniform01() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

absl::Status EtcdJoin::CheckNodes(absl::Time deadline) {
  const std::string key = keys_.Config();
  const std::string mine = absl::StrCat("nodes=", options_.nodes);
  // A read first: once the cluster exists (every join but the first), no
  // write goes through raft for this check.
  Count();
  absl::StatusOr<RangeResult> r = etcd_->Range(key, "", Left(deadline));
  if (!r.ok()) return r.status();
  std::string theirs;
  if (!r->kvs.empty()) {
    theirs = r->kvs.front().value;
  } else {
    Count();
    absl::StatusOr<TxnResult> t = etcd_->Txn({Compare::Unchanged(key, 0)}, {Op::Put(key, mine)},
                                             {Op::Get(key)}, Left(deadline));
    if (!t.ok()) return t.status();
    if (t->succeeded || t->ranges.empty() || t->ranges[0].empty()) return absl::OkStatus();
    theirs = t->ranges[0][0].value;
  }
  if (theirs != mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.nodes is ", options_.nodes, " here, but the cluster under ", options_.prefix,
        " in ", etcd_->name(), " was formed with ", theirs.substr(0, 32),
        " (a wrong cluster.etcd.prefix, or a cluster.nodes that differs between nodes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<EtcdJoin::Claimed> EtcdJoin::Claim(v1::ClusterNode me, int64_t lease,
                                                  absl::Time deadline) {
  me.set_address(options_.address);
  me.set_state("alive");
  for (int attempt = 0; absl::Now() < deadline; ++attempt) {
    if (attempt > 0) {
      // Lost a race for a rank: back off (jittered, growing), so that
      // hundreds of nodes starting together do not retry in lockstep.
      const absl::Duration cap =
          std::min(absl::Milliseconds(20) * (int64_t{1} << std::min(attempt, 6)), Left(deadline));
      absl::SleepFor(cap * Uniform01());
    }
    // One consistent read of what a join needs (not the events under m/).
    Count();
    absl::StatusOr<TxnResult> read = etcd_->Txn(
        {}, {Op::Get(keys_.Nodes(), PrefixEnd(keys_.Nodes())),
             Op::Get(keys_.Ranks(), PrefixEnd(keys_.Ranks())), Op::Get(keys_.Epoch())},
        {}, Left(deadline));
    if (!read.ok()) return read.status();
    if (read->ranges.size() != 3) {
      return absl::InternalError("etcd answered a read of 3 ranges with fewer");
    }
    std::map<int, std::pair<v1::ClusterNode, const KeyValue*>> live;
    std::map<int, std::string> history;
    int64_t epoch = 0;
    for (const KeyValue& kv : read->ranges[0]) {
      const int rank = EtcdKeys::RankIn(kv.key, keys_.Nodes());
      if (rank < 0 || rank >= static_cast<int>(options_.nodes)) continue;
      v1::ClusterNode n;
      if (kv.value.size() <= kMaxNodeValue && n.ParseFromString(kv.value)) live[rank] = {n, &kv};
    }
    for (const KeyValue& kv : read->ranges[1]) {
      const int rank = EtcdKeys::RankIn(kv.key, keys_.Ranks());
      if (rank >= 0) history[rank] = kv.value;
    }
    if (!read->ranges[2].empty()) (void)absl::SimpleAtoi(read->ranges[2][0].value, &epoch);
    int rank = options_.node_rank;
    if (rank >= 0) {
      auto it = live.find(rank);
      if (it != live.end() && it->second.first.address() != options_.address) {
        return absl::AlreadyExistsError(absl::StrCat(
            "node rank ", rank, " is held by the live node ", it->second.first.address(),
            " (cluster.node_rank must differ between nodes)"));
      }
    } else {
      for (const auto& [r, n] : live) {
        if (n.first.address() == options_.address) rank = r;  // this node's last instance
      }
      for (const auto& [r, address] : history) {
        if (rank < 0 && address == options_.address && !live.contains(r)) rank = r;
      }
      // Else a rank never held, else one whose node is gone for good; at
      // random, so that nodes starting together rarely want the same one.
      std::vector<int> never, gone;
      for (int r = 0; r < static_cast<int>(options_.nodes); ++r) {
        if (live.contains(r)) continue;
        (history.contains(r) ? gone : never).push_back(r);
      }
      const std::vector<int>& free = never.empty() ? gone : never;
      if (rank < 0 && !free.empty()) {
        rank = free[std::min(free.size() - 1, static_cast<size_t>(Uniform01() * free.size()))];
      }
      if (rank < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "all ", options_.nodes, " node ranks are held by live nodes (cluster.nodes)"));
      }
    }
    me.set_node_rank(rank);
    const auto held = live.find(rank);
    const int64_t held_mod = held == live.end() ? 0 : held->second.second->mod_revision;
    const int64_t old_lease = held == live.end() ? 0 : held->second.second->lease;
    Count();
    // Compared against this rank's key only: joins of different ranks never
    // conflict (the epoch moves on after, AdvanceEpochPast).
    absl::StatusOr<TxnResult> t =
        etcd_->Txn({Compare::Unchanged(keys_.Node(rank), held_mod)},
                   {Op::Put(keys_.Node(rank), me.SerializeAsString(), lease),
                    Op::Put(keys_.RankOf(rank), options_.address)},
                   {}, Left(deadline));
    if (!t.ok()) return t.status();  // NOT_FOUND: the lease ran out before the join took
    if (!t->succeeded) continue;     // another node took the rank meanwhile: read again
    // This join moves the epoch on (one step may count several joins). In a
    // crowd (many nodes starting together) it waits a little first, so one
    // step covers many joins instead of every watcher seeing N steps.
    absl::SleepFor(std::min(absl::Milliseconds(2) * static_cast<int64_t>(live.size()),
                            absl::Milliseconds(500)) *
                   Uniform01());
    epoch = std::max<int64_t>(epoch + 1, AdvanceEpochPast(t->revision)) - 1;
    if (old_lease != 0 && old_lease != lease) {
      // This node's previous instance: its keys (rendezvous, events) go now.
      Count();
      (void)etcd_->LeaseRevoke(old_lease, absl::Seconds(1));
    }
    Claimed out;
    out.rank = rank;
    out.epoch = static_cast<uint64_t>(epoch + 1);
    out.revision = read->revision;
    for (auto& [r, n] : live) {
      if (r == rank) continue;
      n.first.set_node_rank(r);
      n.first.set_state("alive");
      out.live.push_back(std::move(n.first));
    }
    out.live.push_back(std::move(me));
    return out;
  }
  return absl::DeadlineExceededError("the membership kept changing while joining");
}

int64_t EtcdJoin::AdvanceEpochPast(int64_t revision, absl::Duration timeout) {
  const std::string key = keys_.Epoch();
  Count();
  absl::StatusOr<RangeResult> r = etcd_->Range(key, "", timeout);
  if (!r.ok()) return 0;  // the next loss or join moves it on
  std::vector<KeyValue> now = std::move(r->kvs);
  for (int attempt = 0; attempt < 16; ++attempt) {
    int64_t epoch = 0, mod = 0;
    if (!now.empty()) {
      (void)absl::SimpleAtoi(now.front().value, &epoch);
      mod = now.front().mod_revision;
    }
    if (mod > revision) return epoch;  // written after the change: done
    // Compare-and-put; a failed compare reads the new value in the same call.
    Count();
    absl::StatusOr<TxnResult> t = etcd_->Txn({Compare::Unchanged(key, mod)},
                                             {Op::Put(key, absl::StrCat(epoch + 1))},
                                             {Op::Get(key)}, timeout);
    if (!t.ok()) return 0;
    if (t->succeeded) return epoch + 1;
    now = t->ranges.empty() ? std::vector<KeyValue>{} : std::move(t->ranges[0]);
  }
  return 0;
}

}  // namespace hsdp::etcd
