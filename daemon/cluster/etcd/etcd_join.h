// How a node joins the membership kept in etcd (etcd_member.h has the keys):
//   CheckNodes        every node must agree on cluster.nodes (P m/config);
//   Claim             one transaction claims a rank (by request, by
//                     address, else a free one at random), compared
//                     against that rank's key only, so two nodes never take
//                     one rank and joins of different ranks never conflict
//                     (a lost race backs off, jittered); then the epoch
//                     moves on past the claim;
//   AdvanceEpochPast  "if the epoch was last written before this change,
//                     advance it" (a compare-and-put): a join's step, and
//                     a loss's (by the lost node's successor).
// The lease (this node's, granted by the member) is the caller's.
//
// Thread-safe (no state of its own besides the options); every call blocks
// up to its deadline.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_

#include <atomic>
#include <cstdint>
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
    // Every live node when the rank was claimed, this one included (ranks
    // set, state "alive").
    std::vector<v1::ClusterNode> live;
    // The store's revision of that read: later changes come from the watch.
    int64_t revision = 0;
  };
  // The largest node value read (a key over it is ignored).
  static constexpr size_t kMaxNodeValue = 4096;

  // `etcd` must outlive this; `rpcs` (may be null) counts the calls made.
  EtcdJoin(EtcdClient* etcd, Options options, std::atomic<uint64_t>* rpcs = nullptr)
      : etcd_(etcd), options_(std::move(options)), keys_(options_.prefix), rpcs_(rpcs) {}

  // OK when the cluster was formed with this cluster.nodes, or is formed now
  // with it; FAILED_PRECONDITION naming both when it differs.
  absl::Status CheckNodes(absl::Time deadline);
  // Puts `me` (address, instance, ...) under a rank, attached to `lease`,
  // and moves the epoch on. ALREADY_EXISTS: the requested rank is held by
  // a live node at another address; RESOURCE_EXHAUSTED: every rank is held;
  // NOT_FOUND: `lease` is gone (grant a new one); DEADLINE_EXCEEDED: the
  // membership kept changing until `deadline`. A claim that took the rank of
  // this address's previous instance revokes that instance's lease.
  absl::StatusOr<Claimed> Claim(v1::ClusterNode me, int64_t lease, absl::Time deadline);
  // Moves the epoch on past the membership change at `revision` (unless a
  // later write did); returns the epoch then (0: etcd did not answer).
  int64_t AdvanceEpochPast(int64_t revision, absl::Duration timeout = absl::Seconds(2));

 private:
  void Count() {
    if (rpcs_ != nullptr) rpcs_->fetch_add(1, std::memory_order_relaxed);
  }

  EtcdClient* const etcd_;
  const Options options_;
  const EtcdKeys keys_;
  std::atomic<uint64_t>* const rpcs_;
};

}  // namespace hsdp::etcd

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_JOIN_H_
