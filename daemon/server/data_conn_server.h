// Serves data connections: the hello that claims a session's channel, the
// memfds the client passes afterwards, and the hang-up that ends the
// session when the client process goes away (however it dies).
//
// One epoll thread for all connections; handlers never block for long.
#ifndef HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_
#define HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/server/listener.h"
#include "daemon/session/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class DataConnServer {
 public:
  using UidCheck = std::function<bool(uint32_t uid)>;
  DataConnServer(SessionManager* sessions, const NodePage* node_page, UidCheck allowed);
  ~DataConnServer();

  absl::Status Start();
  void Stop();
  // Takes over a connection the listener routed here (thread-safe). Its
  // hello must arrive by conn.hello_deadline_ns.
  void Adopt(Listener::Accepted conn);

 private:
  struct Conn {
    UniqueFd fd;
    PeerCred cred;
    uint64_t session_id = 0;  // 0 until the hello succeeded
    int64_t deadline_ns = 0;  // for the hello
    ConnectionSlot slot;      // counts against cred.uid while open
  };
  void Loop();
  void OnReadable(Conn& c, bool* drop);
  void Hello(Conn& c, bool* drop);
  void Drop(int fd, const char* why);

  SessionManager* const sessions_;
  const NodePage* const node_page_;
  const UidCheck allowed_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Listener::Accepted> adopted_;  // guarded by mu_
  std::map<int, Conn> conns_;                           // loop thread only
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_DATA_CONN_SERVER_H_
