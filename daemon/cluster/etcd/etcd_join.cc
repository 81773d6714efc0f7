#include "daemon/cluster/etcd/etcd_join.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"

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
  const std::string mine = absl::StrCat("nodes=", options_.nodes, " layout=", EtcdKeys::kLayout);
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
    const bool other_layout = !absl::StrContains(theirs, absl::StrCat(" layout=", EtcdKeys::kLayout));
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.nodes is ", options_.nodes, " here (key layout ", EtcdKeys::kLayout,
        "), but the cluster under ", options_.prefix, " in ", etcd_->name(),
        " was formed with ", theirs.substr(0, 48),
        other_layout && absl::StartsWith(theirs, absl::StrCat("nodes=", options_.nodes))
            ? " (by an hsdpd with another key layout: run one version per cluster, or give "
              "this one its own cluster.etcd.prefix)"
            : " (a wrong cluster.etcd.prefix, or a cluster.nodes that differs between nodes)"));
  }
  return absl::OkStatus();
}

std::string EtcdJoin::HolderRecord(const std::string& address, const std::string& instance) {
  v1::ClusterNode n;
  n.set_address(address);
  n.set_instance(instance);
  return n.SerializeAsString();
}

std::optional<v1::ClusterNode> EtcdJoin::ParseHolder(const std::string& value) {
  v1::ClusterNode n;
  if (value.size() > kMaxNodeValue || !n.ParseFromString(value)) return std::nullopt;
  return n;
}

absl::Status EtcdJoin::ReadWindow(int first, int last, absl::Time deadline,
                                  std::deque<std::vector<KeyValue>>* keep,
                                  std::map<int, Slot>* slots) {
  Count();
  absl::StatusOr<TxnResult> read =
      etcd_->Txn({}, {Op::Get(keys_.Node(first), keys_.Node(last)),
                      Op::Get(keys_.RankOf(first), keys_.RankOf(last))},
                 {}, Left(deadline));
  if (!read.ok()) return read.status();
  if (read->ranges.size() != 2) return absl::InternalError("etcd answered a read of 2 ranges with fewer");
  keys_read_.fetch_add(read->ranges[0].size() + read->ranges[1].size(), std::memory_order_relaxed);
  keep->push_back(std::move(read->ranges[0]));
  for (const KeyValue& kv : keep->back()) {
    const int rank = EtcdKeys::RankIn(kv.key, keys_.Nodes());
    if (rank >= first && rank < last && kv.value.size() <= kMaxNodeValue) (*slots)[rank].node = &kv;
  }
  keep->push_back(std::move(read->ranges[1]));
  for (const KeyValue& kv : keep->back()) {
    const int rank = EtcdKeys::RankIn(kv.key, keys_.Ranks());
    if (rank >= first && rank < last) (*slots)[rank].holder = &kv;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> EtcdJoin::PickRank(const std::vector<KeyValue>& hint, absl::Time deadline,
                                       std::deque<std::vector<KeyValue>>* keep,
                                       std::map<int, Slot>* slots) {
  const int n = static_cast<int>(options_.nodes);
  auto address_of = [](const KeyValue* kv) {
    std::optional<v1::ClusterNode> holder = kv == nullptr ? std::nullopt : ParseHolder(kv->value);
    return holder.has_value() ? holder->address() : std::string();
  };
  if (int rank = options_.node_rank; rank >= 0) {
    RETURN_IF_ERROR(ReadWindow(rank, rank + 1, deadline, keep, slots));
    const Slot& s = (*slots)[rank];
    v1::ClusterNode live;
    if (s.node != nullptr && live.ParseFromString(s.node->value) &&
        live.address() != options_.address) {
      return absl::AlreadyExistsError(absl::StrCat(
          "node rank ", rank, " is held by the live node ", live.address(),
          " (cluster.node_rank must differ between nodes)"));
    }
    return rank;
  }
  // The rank this address held last (its previous instance, alive or not),
  // unless another address took it since.
  int last = -1;
  if (!hint.empty() && absl::SimpleAtoi(hint.front().value, &last) && last >= 0 && last < n) {
    RETURN_IF_ERROR(ReadWindow(last, last + 1, deadline, keep, slots));
    if (address_of((*slots)[last].holder) == options_.address) return last;
  }
  // Else a rank never held, else one whose node is gone; at random, so that
  // nodes starting together rarely want the same one. A window at a time.
  const int windows = (n + kWindow - 1) / kWindow;
  const int w0 = std::min(windows - 1, static_cast<int>(Uniform01() * windows));
  std::vector<int> gone;
  for (int k = 0; k < windows; ++k) {
    const int first = ((w0 + k) % windows) * kWindow;
    const int end = std::min(n, first + kWindow);
    RETURN_IF_ERROR(ReadWindow(first, end, deadline, keep, slots));
    std::vector<int> never;
    for (int r = first; r < end; ++r) {
      const Slot& s = (*slots)[r];
      if (s.node != nullptr) continue;
      (s.holder != nullptr ? gone : never).push_back(r);
    }
    if (!never.empty()) {
      return never[std::min(never.size() - 1, static_cast<size_t>(Uniform01() * never.size()))];
    }
  }
  if (!gone.empty()) {
    return gone[std::min(gone.size() - 1, static_cast<size_t>(Uniform01() * gone.size()))];
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "all ", options_.nodes, " node ranks are held by live nodes (cluster.nodes)"));
}

absl::StatusOr<EtcdJoin::Claimed> EtcdJoin::Claim(v1::ClusterNode me, int64_t lease,
                                                  absl::Time deadline, bool want_list) {
  me.set_address(options_.address);
  me.set_state("alive");
  me.clear_previous_instance();
  me.clear_changed_epoch();
  for (int attempt = 0; absl::Now() < deadline; ++attempt) {
    if (attempt > 0) {
      // Lost a race for a rank: back off (jittered, growing), so that
      // hundreds of nodes starting together do not retry in lockstep.
      const absl::Duration cap =
          std::min(absl::Milliseconds(20) * (int64_t{1} << std::min(attempt, 6)), Left(deadline));
      absl::SleepFor(cap * Uniform01());
    }
    // What every join reads: this address's last rank, the epoch, whether a
    // sweeper is on; the whole membership only when asked (a rejoin).
    std::vector<Op> reads = {Op::Get(keys_.AddressOf(options_.address)), Op::Get(keys_.Epoch()),
                             Op::Get(keys_.Sweeper())};
    if (want_list) reads.push_back(Op::Get(keys_.Nodes(), PrefixEnd(keys_.Nodes())));
    Count();
    absl::StatusOr<TxnResult> read = etcd_->Txn({}, reads, {}, Left(deadline));
    if (!read.ok()) return read.status();
    if (read->ranges.size() != reads.size()) {
      return absl::InternalError("etcd answered a read of several ranges with fewer");
    }
    int64_t epoch = 0;
    if (!read->ranges[1].empty()) (void)absl::SimpleAtoi(read->ranges[1][0].value, &epoch);
    std::deque<std::vector<KeyValue>> keep;
    std::map<int, Slot> slots;
    absl::StatusOr<int> picked = PickRank(read->ranges[0], deadline, &keep, &slots);
    if (!picked.ok()) return picked.status();
    const int rank = *picked;
    const Slot slot = slots[rank];
    me.set_node_rank(rank);
    // Who held the rank before: the live node this one replaces, else the
    // last holder. Members hear of the rank now (news), naming that instance.
    std::string previous;
    if (v1::ClusterNode held; slot.node != nullptr && held.ParseFromString(slot.node->value)) {
      previous = held.instance();
    } else if (slot.holder != nullptr) {
      if (std::optional<v1::ClusterNode> h = ParseHolder(slot.holder->value)) previous = h->instance();
    }
    std::vector<Op> writes = {
        Op::Put(keys_.Node(rank), me.SerializeAsString(), lease),
        Op::Put(keys_.RankOf(rank), HolderRecord(options_.address, me.instance())),
        Op::Put(keys_.AddressOf(options_.address), absl::StrCat(rank))};
    if (slot.node != nullptr || slot.holder != nullptr) {
      v1::ClusterNode news = me;
      news.set_previous_instance(previous);
      news.set_changed_epoch(static_cast<uint64_t>(epoch + 1));
      writes.push_back(Op::Put(keys_.NewsOf(rank), news.SerializeAsString()));
    }
    const int64_t node_mod = slot.node == nullptr ? 0 : slot.node->mod_revision;
    const int64_t holder_mod = slot.holder == nullptr ? 0 : slot.holder->mod_revision;
    const int64_t old_lease = slot.node == nullptr ? 0 : slot.node->lease;
    Count();
    // Compared against this rank's keys only: joins of different ranks
    // never conflict (the epoch moves on after, AdvanceEpochPast).
    absl::StatusOr<TxnResult> t =
        etcd_->Txn({Compare::Unchanged(keys_.Node(rank), node_mod),
                    Compare::Unchanged(keys_.RankOf(rank), holder_mod)},
                   writes, {}, Left(deadline));
    if (!t.ok()) return t.status();  // NOT_FOUND: the lease ran out before the join took
    if (!t->succeeded) {  // another node took the rank meanwhile: read again
      races_lost_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // This join moves the epoch on; joins that overlap may share one step
    // (nobody watches the epoch key: a step wakes no member).
    absl::SleepFor(absl::Milliseconds(50) * Uniform01());
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
    out.sweeper_absent = read->ranges[2].empty();
    if (want_list) {
      for (const KeyValue& kv : read->ranges[3]) {
        const int r = EtcdKeys::RankIn(kv.key, keys_.Nodes());
        v1::ClusterNode n;
        if (r < 0 || r >= static_cast<int>(options_.nodes) || r == rank ||
            kv.value.size() > kMaxNodeValue || !n.ParseFromString(kv.value)) {
          continue;
        }
        n.set_node_rank(r);
        n.set_state("alive");
        out.live.push_back(std::move(n));
      }
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
