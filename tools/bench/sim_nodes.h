// A real simulated member for hsdp-membership-sim: a ClusterMember against
// the coordinator, or an EtcdMember with its own EtcdClient and EtcdStore.
// RunCase runs N of them; RunLightCase runs kObservers of them beside the
// light members. One definition of how either is made.
#ifndef HSDP_TOOLS_BENCH_SIM_NODES_H_
#define HSDP_TOOLS_BENCH_SIM_NODES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/cluster/cluster_member.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_member.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "tools/bench/sim_stores.h"

namespace hsdp::sim {

// The simulator's cluster.etcd.prefix.
inline constexpr char kEtcdPrefix[] = "/hsdp-sim/";

class SimNode {
 public:
  virtual ~SimNode() = default;
  virtual Membership& member() = 0;
  virtual uint64_t rpcs() const = 0;
  // Whether it publishes the others' losses (etcd's sweeper).
  virtual bool sweeping() const { return false; }
};

// Where the members meet: the coordinator's address (embedded) or etcd's
// endpoints (etcd), and the cluster.nodes they all name.
struct NodeStore {
  bool embedded = true;
  std::string coordinator;
  std::vector<std::string> etcd_endpoints;
  uint32_t cluster_nodes = 0;
};

// A member named `name` at `address` (never dialled), with the flags'
// heartbeat, missed heartbeats and phase timeout. An etcd member leaves its
// lease to expire on Stop (a crash for a victim, and no revocations fanned
// out at teardown). Errors: EtcdClient::Connect's.
absl::StatusOr<std::unique_ptr<SimNode>> MakeNode(const NodeStore& store, const std::string& name,
                                                  const std::string& address, const Flags& flags);

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_NODES_H_
