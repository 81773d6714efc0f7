// Who is calling a gRPC method. The services ask an Authenticator and never
// look at the transport: Unix-socket peers are identified by SO_PEERCRED
// now; TCP peers of the multi-node plane (TLS client certificates or a shared
// token) implement the same interface.
#ifndef HSDP_DAEMON_AUTH_AUTHENTICATOR_H_
#define HSDP_DAEMON_AUTH_AUTHENTICATOR_H_

#include "absl/status/statusor.h"
#include "daemon/auth/peer_registry.h"
#include "grpcpp/server_context.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class Authenticator {
 public:
  virtual ~Authenticator() = default;
  // The caller's credentials, or PERMISSION_DENIED naming why not. Thread-safe.
  virtual absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase& ctx) const = 0;
  // Whether `uid` may see every job (root and the daemon's own uid).
  virtual bool IsAdmin(uint32_t uid) const = 0;
};

// Local callers on the daemon's Unix socket: credentials recorded by the
// listener (PeerRegistry), checked against the uid allow-list.
class UnixPeerAuthenticator : public Authenticator {
 public:
  explicit UnixPeerAuthenticator(const PeerRegistry* peers) : peers_(peers) {}
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase& ctx) const override;
  bool IsAdmin(uint32_t uid) const override;

 private:
  const PeerRegistry* const peers_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_AUTH_AUTHENTICATOR_H_
