// hsdp-membership-sim's light members on etcd (--members=light
// --stores=etcd): see LightFleet (sim_light.h) for what they share.
//
// A member joins as EtcdMember::JoinOnce does, through the real EtcdJoin
// against the real etcd: the cluster.nodes check, a lease of heartbeat x
// missed_heartbeats, the claim of a rank (a window of ranks, never the
// membership) and the epoch step. It renews its lease every heartbeat
// through EtcdClient::LeaseKeepAlive, on a keep-alive stream of its own
// kept open (on the raft leader unless keepalives_on_leader is false), and
// joins again with a new lease when etcd says the lease is gone. It keeps
// its rank, instance and lease only: no watch (the kObservers real
// EtcdMembers watch, campaign for the sweeper and see losses).
//
// Thread-safe as LightFleet.
#ifndef HSDP_TOOLS_BENCH_SIM_LIGHT_ETCD_H_
#define HSDP_TOOLS_BENCH_SIM_LIGHT_ETCD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_join.h"
#include "tools/bench/sim_light.h"

namespace hsdp::sim {

class EtcdFleet : public LightFleet {
 public:
  struct EtcdOptions {
    std::vector<std::string> endpoints;
    std::string prefix;  // cluster.etcd.prefix, ends with '/'
    uint32_t missed_heartbeats = 5;
    bool keepalives_on_leader = true;
  };
  // Connects options.channels clients; errors are etcd's.
  static absl::StatusOr<std::unique_ptr<EtcdFleet>> Make(EtcdOptions etcd, Options options);
  ~EtcdFleet() override { Stop(); }

  // Keep-alive streams the fleet's clients opened.
  uint64_t keepalive_streams() const;
  // Claims, the ones that lost their rank to another join, and the rank
  // keys they read.
  std::string JoinStats() const override;

 private:
  EtcdFleet(EtcdOptions etcd, Options options);
  absl::Status JoinOnce(int i, absl::Duration timeout) override;
  bool BeatOnce(int i, absl::Duration timeout) override;
  etcd::EtcdClient& ClientOf(int i) { return *clients_[i % clients_.size()]; }

  const EtcdOptions etcd_;
  std::vector<std::unique_ptr<etcd::EtcdClient>> clients_;
  std::atomic<uint64_t> claims_{0}, races_lost_{0}, keys_read_{0};
  std::unique_ptr<int64_t[]> leases_;  // member i's (0: none): touched by its worker only
};

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_LIGHT_ETCD_H_
