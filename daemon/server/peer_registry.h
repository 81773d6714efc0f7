// Maps gRPC connections to the credentials of the process on the other end.
// The listener records SO_PEERCRED when it accepts a connection and hands
// the fd to gRPC, whose ServerContext::peer() then reads "fd:N".
//
// Caveat: a connection's fd number can be reused after it closes; the entry
// is overwritten when the new connection is accepted, before gRPC sees it.
#ifndef HSDP_DAEMON_SERVER_PEER_REGISTRY_H_
#define HSDP_DAEMON_SERVER_PEER_REGISTRY_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class PeerRegistry {
 public:
  // `allowed_uids` empty: the daemon's own uid and root.
  explicit PeerRegistry(std::vector<uint32_t> allowed_uids);

  void Add(int fd, const PeerCred& cred);
  // The credentials behind a gRPC peer string ("fd:12"), if known.
  std::optional<PeerCred> Lookup(const std::string& grpc_peer) const;
  bool Allowed(uint32_t uid) const;

 private:
  std::vector<uint32_t> allowed_;
  mutable absl::Mutex mu_;
  std::map<int, PeerCred> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_PEER_REGISTRY_H_
