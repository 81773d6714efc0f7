// NodeLinks over Gloo's TCP transport (gloo::transport::tcp) bound to
// cluster.data_address, with the rendezvous of each (group key, epoch)
// through a gloo::rendezvous::Store — the coordinator's key/value store in
// the daemon (daemon/cluster/gloo_store.h), a HashStore in tests.
//
// `devices` tcp devices (IO threads) per transport, created at the first
// Connect; per link one gloo::rendezvous::Context per device, fully meshed,
// with the store under the prefix "<key>/<epoch>" (shortened to a hash when
// long; the contexts of devices 1.. under "d<k>/" inside it).
// Exchange posts gloo UnboundBuffer sends and receives (slot = low 32 bits of
// the tag << 32 | part) and waits with the time left to the deadline; Abort
// wakes the waits (abortWaitRecv/abortWaitSend); any error closes the
// context's connections, so peers fail at once instead of at their deadline,
// and Gloo no longer touches the buffers once Exchange returns. Every Gloo
// exception is caught here and becomes a Status (UNAVAILABLE naming the node,
// or DEADLINE_EXCEEDED).
//
// Security: Gloo's TCP traffic is neither authenticated nor encrypted.
// Anyone who can reach cluster.data_address can connect to a link's ports
// during its rendezvous or inject bytes into a connection; keep the data
// network private to the cluster (docs/cluster.md). Gloo also aborts the
// process (an exception in its IO thread) when a peer sends more bytes than
// the receive posted for that message: honest daemons never do (every
// cross-node task first exchanges a header, and sizes follow from it), so
// only a hostile host on the data network can. A connection reset before
// Gloo accepted it used to end the process too (an exception in the same
// thread); gloo_peer_name.h guards that one (tested).
//
// Store keys: each Connect writes its participant's keys under its prefix
// (Gloo's, and "instance/<index>").
// Gloo's Store cannot delete, so the link hands the keys it wrote to
// `release` once they can no longer be needed: after its first successful
// Exchange (every participant finished connecting, so every address was
// read) or when the connect failed. Without `release` they stay until the
// coordinator restarts.
// Connecting the same (key, epoch) twice is not supported (the second
// rendezvous would read the first one's addresses).
//
// Thread-safety: the factory and links are thread-safe (one Exchange at a
// time per link).
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_TRANSPORT_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/crossnode/node_transport.h"

namespace gloo::rendezvous {
class Store;
}

namespace hsdp {

struct GlooTransportOptions {
  std::string data_address;  // host or IP to bind (cluster.data_address)
  // This daemon's instance in the cluster, written beside its address in
  // every rendezvous ("instance/<index>"), so each link knows which daemon
  // instance every peer is (NodeLink::peer_instance). Empty: not written.
  std::string instance;
  // A store for the keys under `prefix` (one per link); called per Connect.
  std::function<std::unique_ptr<gloo::rendezvous::Store>(const std::string& prefix)> store;
  // TCP devices (each with its own IO thread and connections); a link has one
  // Gloo context per device and stripes messages of at least
  // `stripe_min_bytes` across them, so the kernel's copies run in parallel.
  // Must be the same on every daemon. (On the 2-core development VM, 2
  // devices measured no better than 1 on loopback; more may pay on real
  // NICs and more cores.)
  int devices = 1;
  // Deletes `keys` (as written through the store of `prefix`). Called at most
  // once per Connect, from a link's Exchange or from Connect; may block
  // briefly on the network. Null: keys are kept.
  std::function<void(const std::string& prefix, const std::vector<std::string>& keys)> release;
  size_t stripe_min_bytes = 256 << 10;
};

std::unique_ptr<TransportFactory> MakeGlooTransport(GlooTransportOptions options);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_GLOO_TRANSPORT_H_
