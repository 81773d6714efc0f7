// The daemon's Unix socket. One socket file serves both gRPC (control) and
// data connections (fd passing + session liveness); the first 8 bytes a
// client sends tell them apart. Owns the lock file that keeps a second
// daemon off the same socket, and replaces a stale socket left by a crash.
//
// Any local user can connect, so the listener trusts nothing on the path:
// the socket's directory is opened with OpenTrustedDir (no symlinks, owned
// by root or us, not writable by others) and every file in it is reached
// through that directory fd (openat/unlinkat), so swapping a path component
// cannot redirect the daemon; and it removes only files it created itself
// (the socket, checked by inode).
#ifndef HSDP_DAEMON_SERVER_LISTENER_H_
#define HSDP_DAEMON_SERVER_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class Listener {
 public:
  using Handler = std::function<void(UniqueFd fd, const PeerCred& cred)>;

  // Binds `path` with permissions `mode`. FAILED_PRECONDITION naming the
  // other instance's pid when another hsdpd holds the socket, and naming the
  // problem when the directory or the lock file cannot be trusted or a
  // non-socket file sits at `path`.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& path, uint32_t mode);
  ~Listener();

  // Starts accepting: connections are routed to `on_grpc` or `on_data` on
  // the listener thread (handlers must not block).
  void Start(Handler on_grpc, Handler on_data);
  // Stops accepting, joins the thread, removes the socket (if it is still
  // the one this process created) and the lock file. Idempotent.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  Listener() = default;
  absl::Status TakeLock();
  absl::Status BindSocket(uint32_t mode);
  void Loop();

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
  Handler on_grpc_;
  Handler on_data_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_LISTENER_H_
