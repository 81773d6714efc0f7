// What an engine whose groups span nodes may also tell (Group asks for it
// with dynamic_cast; an engine without it is never asked): which instance of
// a peer node's daemon the links of a group's epoch reach. A daemon that
// restarts comes back with a new instance (daemon/cluster/membership.h), so
// a group can tell an epoch it still runs with the old daemon, which ended
// with that process, from one it already runs with the new daemon.
#ifndef HSDP_DAEMON_ENGINE_PEER_INSTANCES_H_
#define HSDP_DAEMON_ENGINE_PEER_INSTANCES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace hsdp {

class PeerInstances {
 public:
  virtual ~PeerInstances() = default;

  // For each link of group `key` (its own and its point-to-point ones) in
  // `epoch` that connected node `node`'s daemon: the instance that daemon
  // gave in the rendezvous ("" when the link cannot tell). Links not
  // connected yet are not listed. Thread-safe; never blocks on the network.
  virtual std::vector<std::string> LinkedInstances(const std::string& key, uint32_t epoch,
                                                   int node) const = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_PEER_INSTANCES_H_
