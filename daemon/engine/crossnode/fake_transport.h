// An in-process transport for tests of the cross-node engine: a FakeNetwork
// joins several simulated nodes (one engine each, all in one process), and
// the NodeLinks it makes really move bytes between them. Sends are buffered
// (copied at once), receives wait for the matching message.
//
// Faults, at any time:
//   KillNode(n)     node n's links break (its own Exchanges fail; peers
//                   waiting on it get UNAVAILABLE naming node n); its later
//                   Connects fail, and peers' Connects with it wait in vain;
//   SetDelay(n, d)  every message node n sends arrives d later;
//   SetSilent(n)    node n never answers: what it sends is dropped and it
//                   never shows up at a Connect (peers reach their deadline).
// A link that ends (Abort, error, destruction) is closed towards its peers as
// a broken TCP connection would be: a peer waiting on it gets UNAVAILABLE.
// A message whose size differs from the receive is an error on both ends.
//
// Thread-safety: everything is thread-safe.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_FAKE_TRANSPORT_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_FAKE_TRANSPORT_H_

#include <memory>

#include "absl/time/time.h"
#include "daemon/engine/crossnode/node_transport.h"

namespace hsdp {

class FakeNetwork {
 public:
  FakeNetwork();
  ~FakeNetwork();
  FakeNetwork(const FakeNetwork&) = delete;
  FakeNetwork& operator=(const FakeNetwork&) = delete;

  // The transport of node `node`. May outlive the network object (they share
  // its state).
  std::unique_ptr<TransportFactory> MakeTransport(int node);

  void KillNode(int node);
  void SetDelay(int node, absl::Duration delay);
  void SetSilent(int node, bool silent);

  // Links connected so far (counted once per node and Connect).
  int connects() const;

  struct State;  // shared with the transports and links (fake_transport.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_FAKE_TRANSPORT_H_
