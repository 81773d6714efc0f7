// The daemon's Unix socket. One socket file serves both gRPC (control) and
// data connections (fd passing + session liveness); the first 8 bytes a
// client sends tell them apart. Owns the lock file that keeps a second
// daemon off the same socket, and replaces a stale socket left by a crash.
#ifndef HSDP_DAEMON_SERVER_LISTENER_H_
#define HSDP_DAEMON_SERVER_LISTENER_H_

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
  // other instance's pid when another hsdpd holds the socket.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& path, uint32_t mode);
  ~Listener();

  // Starts accepting: connections are routed to `on_grpc` or `on_data` on
  // the listener thread (handlers must not block).
  void Start(Handler on_grpc, Handler on_data);
  // Stops accepting, joins the thread, removes the socket and the lock file.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  Listener() = default;
  void Loop();

  std::string path_;
  std::string lock_path_;
  UniqueFd lock_fd_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd to stop the loop
  Handler on_grpc_;
  Handler on_data_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_LISTENER_H_
