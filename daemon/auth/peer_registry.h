// Who is on the other end of the daemon's connections, and how many
// connections each uid holds.
//
// PeerRegistry maps gRPC connections to the credentials of the process on
// the other end. The listener records SO_PEERCRED when it accepts a
// connection and hands the fd to gRPC, whose ServerContext::peer() then
// reads "fd:N". An fd number can be reused after gRPC closes it: the entry
// is overwritten when a new gRPC connection gets that number, before gRPC
// sees it, and Sweep() drops entries whose number no longer refers to the
// socket recorded at Add() (fstat st_dev/st_ino), which is how we learn that
// gRPC closed a connection: gRPC has no hook for that.
//
// ConnectionLimiter counts live connections per uid. Every accepted
// connection holds a ConnectionSlot until it closes: the listener while the
// connection has not said which kind it is, the data-connection server for
// data connections, and the PeerRegistry entry for gRPC connections (so a
// gRPC connection's slot is released by the Sweep() that notices it closed).
#ifndef HSDP_DAEMON_AUTH_PEER_REGISTRY_H_
#define HSDP_DAEMON_AUTH_PEER_REGISTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class ConnectionLimiter;

// One live connection counted against its uid; releases the count when
// destroyed. Move-only; an empty slot (default-constructed) counts nothing.
class ConnectionSlot {
 public:
  ConnectionSlot() = default;
  ConnectionSlot(ConnectionSlot&&) noexcept = default;
  ConnectionSlot& operator=(ConnectionSlot&& o) noexcept;
  ~ConnectionSlot();

 private:
  friend class ConnectionLimiter;
  ConnectionSlot(std::shared_ptr<ConnectionLimiter> limiter, uid_t uid)
      : limiter_(std::move(limiter)), uid_(uid) {}
  void Release();

  std::shared_ptr<ConnectionLimiter> limiter_;
  uid_t uid_ = 0;
};

// Thread-safe. Slots keep the limiter alive, so they may outlive its owner.
class ConnectionLimiter : public std::enable_shared_from_this<ConnectionLimiter> {
 public:
  // Root (uid 0) is counted but never refused: root can stop or ptrace the
  // daemon anyway, so a limit would protect nothing.
  static std::shared_ptr<ConnectionLimiter> Create(uint32_t max_per_uid);

  // A slot for a new connection of `uid`, or nullopt when `uid` already
  // holds max_per_uid live connections.
  std::optional<ConnectionSlot> TryAcquire(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  // Live connections of `uid`.
  uint32_t Live(uid_t uid) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t max_per_uid() const { return max_per_uid_; }

 private:
  friend class ConnectionSlot;
  explicit ConnectionLimiter(uint32_t max_per_uid) : max_per_uid_(max_per_uid) {}
  void Release(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);

  const uint32_t max_per_uid_;
  mutable absl::Mutex mu_;
  std::map<uid_t, uint32_t> live_ ABSL_GUARDED_BY(mu_);
};

// Thread-safe.
class PeerRegistry {
 public:
  // `allowed_uids` empty: the daemon's own uid and root.
  explicit PeerRegistry(std::vector<uint32_t> allowed_uids);

  // Records the gRPC connection `fd` (about to be handed to gRPC) and keeps
  // `slot` until Sweep() finds the connection gone.
  void Add(int fd, const PeerCred& cred, ConnectionSlot slot = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries of connections gRPC has closed (their fd is closed or
  // now refers to another file), releasing their slots. Returns how many.
  // O(live gRPC connections) fstat calls.
  size_t Sweep() ABSL_LOCKS_EXCLUDED(mu_);
  // The credentials behind a gRPC peer string ("fd:12"), if known.
  std::optional<PeerCred> Lookup(const std::string& grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Allowed(uint32_t uid) const ABSL_LOCKS_EXCLUDED(mu_);
  // SIGHUP (node.allowed_uids): from now on only these uids (empty: the
  // daemon's own uid and root) may connect and call.
  void SetAllowed(std::vector<uint32_t> allowed_uids) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    PeerCred cred;
    dev_t dev = 0;
    ino_t ino = 0;
    ConnectionSlot slot;
  };

  mutable absl::Mutex mu_;
  std::vector<uint32_t> allowed_ ABSL_GUARDED_BY(mu_);
  std::map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_AUTH_PEER_REGISTRY_H_
