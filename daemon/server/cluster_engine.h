// The engine of a daemon in a cluster: the node's own engine wrapped in the
// hierarchical cross-node engine (daemon/engine/crossnode/), whose links are
// Gloo over TCP on cluster.data_address (the listen host by default) and
// rendezvous through the coordinator's key/value store (GlooStore), with
// engine.threads workers and timeouts.collective_ms per cross-node task.
// In a build without it, returns `local` (logged): the cluster's control
// plane works, and groups that span nodes fail with FAILED_PRECONDITION.
#ifndef HSDP_DAEMON_SERVER_CLUSTER_ENGINE_H_
#define HSDP_DAEMON_SERVER_CLUSTER_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/config/node_config.h"
#include "daemon/engine/engine.h"

namespace hsdp {

class ClusterStore;

// `coordinator` must outlive the engine; `instance` is this daemon's in the
// cluster's membership (its links tell the other daemons which one they
// reach). Matches ClusterEngineFactory.
absl::StatusOr<std::unique_ptr<Engine>> MakeClusterEngine(std::unique_ptr<Engine> local,
                                                          ClusterStore* coordinator,
                                                          const NodeConfig& config, int threads,
                                                          const std::string& instance);

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_CLUSTER_ENGINE_H_
