// Serves data connections: the hello that claims a session's channel, the
// memfds the client passes afterwards, and the hang-up that ends the
// session when the client process goes away (however it dies).
//
// One epoll thread for all connections, and nothing on it blocks: sockets
// are non-blocking and each connection keeps its own partial message (and
// the fds that came with it), so a client that sends a byte at a time holds
// up nobody else. A connection must complete its hello by the deadline the
// listener set (timeouts.hello_ms from accept). Afterwards each message
// carries one fd of a declared kind (shm::FdMessage::kind): a memfd (host
// buffers), or — only for a session that negotiated kFeatureDeviceMemory — a
// device-memory handle, which only RegisterDeviceBuffer can claim. Anything
// else (a socket, which could be the connection itself and keep it open
// forever, a pipe, a file, an unknown kind) is closed at once and ends the
// session, as does a message with more fds than it may carry.
#ifndef HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_
#define HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/listener.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"

namespace hsdp {

class DataConnServer {
 public:
  using UidCheck = std::function<bool(uint32_t uid)>;
  DataConnServer(SessionManager* sessions, const WakeFd* wake, UidCheck allowed);
  ~DataConnServer();

  absl::Status Start();
  // Joins the thread and closes every connection (ending their sessions is
  // the session manager's job at shutdown). Idempotent.
  void Stop();
  // Takes over a connection the listener routed here (thread-safe, never
  // blocks). Its hello must be complete by conn.hello_deadline_ns.
  void Adopt(Listener::Accepted conn) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends a group's small-operation arena to session `session_id`'s client
  // (shm::ArenaMessage naming `fd_tag`, with a copy of `fd`), from any
  // thread. Never blocks: a client whose receive buffer is full gets
  // RESOURCE_EXHAUSTED; a session without a data connection NOT_FOUND.
  absl::Status SendArena(uint64_t session_id, uint64_t fd_tag, int fd)
      ABSL_LOCKS_EXCLUDED(send_mu_);

 private:
  struct Conn {
    UniqueFd fd;
    PeerCred cred;
    ConnectionSlot slot;
    int64_t hello_deadline_ns = 0;
    uint64_t session_id = 0;  // 0 until the hello succeeded
    // The message being received (a DataHello until the hello succeeded,
    // then FdMessages), its bytes so far, and the fds that came with them.
    alignas(8) unsigned char buf[sizeof(shm::DataHello)] = {};
    size_t have = 0;
    std::vector<UniqueFd> fds;
  };

  void Loop();
  void AddAdopted() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads what `c` sent; returns why to drop it, or nullopt to keep it.
  std::optional<std::string> OnReadable(Conn& c);
  std::optional<std::string> Hello(Conn& c);
  std::optional<std::string> OnFdMessage(Conn& c);
  // Closes `fd`'s connection and ends its session, if it claimed one.
  void Drop(int fd, const std::string& why);
  // Drops connections past their hello deadline; returns the earliest
  // deadline left (INT64_MAX if none).
  int64_t ExpireHellos(int64_t now);

  SessionManager* const sessions_;
  const WakeFd* const dispatcher_wake_;  // handed to every session
  const UidCheck allowed_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<Listener::Accepted> adopted_ ABSL_GUARDED_BY(mu_);
  std::map<int, Conn> conns_;  // loop thread only
  // The connection of every session that completed its hello, for
  // SendArena; an entry goes before its connection is closed.
  absl::Mutex send_mu_;
  std::map<uint64_t, int> session_conns_ ABSL_GUARDED_BY(send_mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_
