// The daemon's Unix socket. One socket file serves both gRPC (control) and
// data connections (fd passing + session liveness); the first 8 bytes a
// client sends tell them apart. Owns the lock file that keeps a second
// daemon off the same socket, and replaces a stale socket left by a crash.
//
// Any local user can connect, so the listener trusts nothing on the path:
// - the socket's directory is opened with OpenTrustedDir (no symlinks, owned
//   by root or us, not writable by others) and every file in it is reached
//   through that directory fd (openat/unlinkat), so swapping a path
//   component cannot redirect the daemon;
// - it removes only files it created itself (the socket, checked by inode);
// - every connection counts against its uid (limits.max_connections_per_uid)
//   from accept until it closes, and must send its first 8 bytes within
//   timeouts.hello_ms;
// - no peer can make the accept loop spin: a connection with fewer than 8
//   bytes is watched edge-triggered (woken only by new bytes), and running
//   out of file descriptors closes the new connection with a reserve fd and
//   backs off instead of retrying at once.
#ifndef HSDP_DAEMON_SERVER_LISTENER_H_
#define HSDP_DAEMON_SERVER_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/auth/peer_registry.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class Listener {
 public:
  struct Options {
    uint32_t max_connections_per_uid = 64;  // limits.max_connections_per_uid
    uint32_t hello_timeout_ms = 5000;       // timeouts.hello_ms
  };

  // A connection that has sent its first 8 bytes (still unread: they are
  // only peeked at), handed to a Handler.
  struct Accepted {
    UniqueFd fd;  // non-blocking, close-on-exec
    PeerCred cred;
    ConnectionSlot slot;        // counts against cred.uid until destroyed
    int64_t hello_deadline_ns;  // shm::NowNanos() scale: accept + timeouts.hello_ms
  };
  using Handler = std::function<void(Accepted conn)>;

  // Binds `path` with permissions `mode`. FAILED_PRECONDITION naming the
  // other instance's pid when another hsdpd holds the socket, and naming the
  // problem when the directory or the lock file cannot be trusted or a
  // non-socket file sits at `path`.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& path, uint32_t mode);
  ~Listener();

  // Starts accepting: connections are routed to `on_grpc` or `on_data` on
  // the listener thread (handlers must not block). `peers` (not owned, must
  // outlive Stop()) is swept for closed gRPC connections once a second and
  // whenever a uid reaches its limit.
  void Start(const Options& options, PeerRegistry* peers, Handler on_grpc, Handler on_data);
  // Stops accepting, joins the thread, closes unrouted connections, removes
  // the socket (if it is still the one this process created) and the lock
  // file. Idempotent.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  struct Pending {
    UniqueFd fd;
    PeerCred cred;
    ConnectionSlot slot;
    int64_t deadline_ns;
  };

  Listener() = default;
  absl::Status TakeLock();
  absl::Status BindSocket(uint32_t mode);
  void Loop();
  void AcceptAll(int64_t now);
  // At the fd limit: frees the reserve fd, accepts and closes one connection,
  // takes the reserve back. False when that did not work (then back off).
  bool ShedOneConnection();
  void PauseAccepting(int64_t now);
  void Admit(UniqueFd fd, int64_t now);
  void TryRoute(int fd, uint32_t events);
  // Closes connections past their deadline; returns the earliest deadline
  // left (INT64_MAX if none).
  int64_t ExpirePending(int64_t now);

  std::string path_;
  std::string dir_;
  std::string name_;       // the socket's file name in dir_fd_
  std::string lock_name_;  // name_ + ".lock"
  UniqueFd dir_fd_;
  UniqueFd lock_fd_;
  UniqueFd listen_fd_;
  bool created_socket_ = false;  // the file at path_ is ours to remove...
  dev_t socket_dev_ = 0;         // ...if it is still this inode
  ino_t socket_ino_ = 0;
  UniqueFd wake_fd_;  // eventfd to stop the loop

  // Set by Start(); used only by the loop thread afterwards.
  Options options_;
  PeerRegistry* peers_ = nullptr;
  std::shared_ptr<ConnectionLimiter> limiter_;
  Handler on_grpc_;
  Handler on_data_;
  UniqueFd epoll_fd_;
  UniqueFd reserve_fd_;              // freed to accept-and-close at EMFILE
  int64_t accept_paused_until_ = 0;  // 0: accepting
  std::map<int, Pending> pending_;   // connections that have not sent 8 bytes

  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_LISTENER_H_
