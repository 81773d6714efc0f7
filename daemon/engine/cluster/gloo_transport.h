// NodeLinks over Gloo's TCP transport (gloo::transport::tcp) bound to
// cluster.data_address, with the rendezvous of each (group key, epoch)
// through a gloo::rendezvous::Store — the coordinator's key/value store in
// the daemon (daemon/cluster/gloo_store.h), a HashStore in tests.
#ifndef HSDP_DAEMON_ENGINE_CLUSTER_GLOO_TRANSPORT_H_
#define HSDP_DAEMON_ENGINE_CLUSTER_GLOO_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "daemon/engine/cluster/node_transport.h"

namespace gloo::rendezvous {
class Store;
}

namespace hsdp {

struct GlooTransportOptions {
  std::string data_address;  // host or IP to bind (cluster.data_address)
  // A store for the keys under `prefix` (one per link); called per Connect.
  std::function<std::unique_ptr<gloo::rendezvous::Store>(const std::string& prefix)> store;
};

std::unique_ptr<TransportFactory> MakeGlooTransport(GlooTransportOptions options);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CLUSTER_GLOO_TRANSPORT_H_
