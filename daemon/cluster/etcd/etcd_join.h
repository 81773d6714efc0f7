// How a node joins the membership kept in etcd (etcd_keys.h and
// etcd_member.h have the keys):
//   CheckNodes        every node must agree on cluster.nodes and on the key
//                     layout (P m/config);
//   Claim             one transaction claims a rank, compared against that
//                     rank's keys only, so two nodes never take one rank and
//                     joins of different ranks never conflict (a lost race
//                     backs off, jittered). The rank: the requested one; else
//                     the one this address held last (P h/addr/<address>,
//                     confirmed by P h/ranks/<r>); else one never held, else
//                     one whose node is gone, found by reading a window of
//                     ranks at a random place, never the whole membership. A
//                     rank that was held before gets news (P w/news/<r>:
//                     alive, naming the instance it replaces), which every
//                     member hears; a rank's first holder gets none. Then the
//                     epoch moves on past the claim;
//   AdvanceEpochPast  "if the epoch was last written before this change,
//                     advance it" (a compare-and-put): a join's step, and a
//                     loss's (by the sweeper).
// The lease (this node's, granted by the member) is the caller's.
//
// Thread-safe (no state of its own besides the options and counters); every
// call blocks up to its deadline.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_keys.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp::etcd {

class EtcdJoin {
 public:
  struct Options {
    std::string prefix;  // cluster.etcd.prefix, ends with '/'
    std::string address;
    uint32_t nodes = 1;
    int node_rank = -1;  // -1: any
  };
  struct Claimed {
    int rank = -1;
    // The epoch after this join's step.
    uint64_t epoch = 0;
    // With `want_list`: every live node when the rank was claimed, this one
    // included (ranks set, state "alive"). Without: this node alone.
    std::vector<v1::ClusterNode> live;
    // The store's revision of the claim's first read: later changes come
    // from the watch.
    int64_t revision = 0;
    // Nobody held the sweeper's key at that read.
    bool sweeper_absent = false;
  };
  // The largest node value read (a key over it is ignored).
  static constexpr size_t kMaxNodeValue = 4096;
  // Ranks read per window while looking for a free one.
  static constexpr int kWindow = 64;

  // `etcd` must outlive this; `rpcs` (may be null) counts the calls made.
  EtcdJoin(EtcdClient* etcd, Options options, std::atomic<uint64_t>* rpcs = nullptr)
      : etcd_(etcd), options_(std::move(options)), keys_(options_.prefix), rpcs_(rpcs) {}

  // OK when the cluster was formed with this cluster.nodes and layout, or is
  // formed now with them; FAILED_PRECONDITION naming both when they differ.
  absl::Status CheckNodes(absl::Time deadline);
  // Puts `me` (address, instance, ...) under a rank, attached to `lease`,
  // and moves the epoch on. ALREADY_EXISTS: the requested rank is held by
  // a live node at another address; RESOURCE_EXHAUSTED: every rank is held;
  // NOT_FOUND: `lease` is gone (grant a new one); DEADLINE_EXCEEDED: the
  // membership kept changing until `deadline`. A claim that took the rank of
  // this address's previous instance revokes that instance's lease.
  absl::StatusOr<Claimed> Claim(v1::ClusterNode me, int64_t lease, absl::Time deadline,
                                bool want_list = false);
  // Moves the epoch on past the membership change at `revision` (unless a
  // later write did); returns the epoch then (0: etcd did not answer).
  int64_t AdvanceEpochPast(int64_t revision, absl::Duration timeout = absl::Seconds(2));

  // Keys the claims read (a test's measure of "never the whole membership").
  uint64_t keys_read() const { return keys_read_.load(std::memory_order_relaxed); }
  // Claims that lost their rank to another node's and read again.
  uint64_t races_lost() const { return races_lost_.load(std::memory_order_relaxed); }

  // What P h/ranks/<r> holds: who held rank r last.
  static std::string HolderRecord(const std::string& address, const std::string& instance);
  // Parses a P h/ranks/<r> value; nullopt when malformed.
  static std::optional<v1::ClusterNode> ParseHolder(const std::string& value);

 private:
  struct Slot {  // one rank as a read saw it
    const KeyValue* node = nullptr;    // P n/<r>, live
    const KeyValue* holder = nullptr;  // P h/ranks/<r>
  };
  void Count() {
    if (rpcs_ != nullptr) rpcs_->fetch_add(1, std::memory_order_relaxed);
  }
  // Reads ranks [first, last) into `slots` (keeping the answer in `keep`).
  absl::Status ReadWindow(int first, int last, absl::Time deadline,
                          std::deque<std::vector<KeyValue>>* keep, std::map<int, Slot>* slots);
  // The rank to claim: requested, this address's last, never held, gone.
  absl::StatusOr<int> PickRank(const std::vector<KeyValue>& hint, absl::Time deadline,
                               std::deque<std::vector<KeyValue>>* keep,
                               std::map<int, Slot>* slots);

  EtcdClient* const etcd_;
  const Options options_;
  const EtcdKeys keys_;
  std::atomic<uint64_t>* const rpcs_;
  std::atomic<uint64_t> keys_read_{0};
  std::atomic<uint64_t> races_lost_{0};
};

}  // namespace hsdp::etcd

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_
