// The node-to-node data transport of cross-node groups: a NodeLink connects
// the daemons that host members of one group in one epoch (and only those);
// a TransportFactory makes links. The Gloo implementation
// (gloo_transport.h) runs over TCP on cluster.data_address and rendezvous
// through the coordinator's key/value store; the fake
// (fake_transport.h) connects links inside one process for tests.
//
// Nothing here authenticates the bytes that arrive: peers are the cluster's
// daemons, reached on the data network (docs/cluster.md, "Trust").
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_NODE_TRANSPORT_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_NODE_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsdp {

// One message of an Exchange, to or from link peer `peer` (an index into
// NodeLink::nodes(), never self()). A message is identified by (tag of the
// Exchange, part): several messages between the same two peers in one
// Exchange need distinct parts.
struct SendRange {
  int peer = 0;
  const void* data = nullptr;
  size_t bytes = 0;
  uint32_t part = 0;
};
struct RecvRange {
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;  // must equal what the peer sends with the same tag and part
  uint32_t part = 0;
};

class NodeLink {
 public:
  virtual ~NodeLink() = default;

  // Node ranks of the participating daemons, ascending; self() indexes this node.
  virtual const std::vector<int>& nodes() const = 0;
  virtual int self() const = 0;

  // Posts every send and receive, then waits until all of them finished.
  // Messages between two peers are matched by (`tag`, part) (the caller makes
  // them unique per message in flight; the Gloo link uses the low 32 bits of
  // the tag). A message whose size differs from the receive posted for it is
  // an error of the link, never written past the receive. DEADLINE_EXCEEDED at `deadline` naming the
  // peers still outstanding; the status given to Abort() when aborted;
  // UNAVAILABLE naming the peer when a connection fails. After any error the
  // link is broken: every later call fails at once with the same error.
  // One Exchange at a time per link.
  virtual absl::Status Exchange(const std::vector<SendRange>& sends,
                                const std::vector<RecvRange>& recvs, uint64_t tag,
                                absl::Time deadline) = 0;

  // Ends the Exchange in progress (from any thread) and breaks the link with
  // `why`. Idempotent; never blocks on the network.
  virtual void Abort(const absl::Status& why) = 0;

  // The instance (PeerInstances) of the daemon link peer `peer` is: what it
  // said in the rendezvous. Empty when unknown (it did not say, or this
  // transport cannot tell).
  virtual std::string peer_instance(int peer) const {
    (void)peer;
    return "";
  }
};

// The rules every transport applies to its arguments (one definition, so a
// fake refuses exactly what the real link refuses).
//
// The index of `this_node` in `nodes` (what the link's self() returns) when
// `nodes` is at least two ascending, distinct node ranks that include
// `this_node`; INVALID_ARGUMENT naming both otherwise.
absl::StatusOr<int> LinkSelfIndex(const std::vector<int>& nodes, int this_node);

// An Exchange on a link of `link_size` daemons from link index `self`:
// INVALID_ARGUMENT when a message's peer is out of range or self, or when two
// sends to one peer (or two receives from one peer) share a part.
absl::Status CheckExchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                           int link_size, int self);

class TransportFactory {
 public:
  virtual ~TransportFactory() = default;

  // Connects this node to the other daemons of `nodes` (ascending node
  // ranks, `this_node` among them) for group `key` in `epoch`. Every
  // participant calls it with the same arguments; it blocks until all are
  // connected or `deadline` (DEADLINE_EXCEEDED naming who did not come).
  // Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key,
                                                            uint32_t epoch,
                                                            const std::vector<int>& nodes,
                                                            int this_node,
                                                            absl::Time deadline) = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_NODE_TRANSPORT_H_
