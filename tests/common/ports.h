// Free loopback TCP ports for tests that start servers.
#ifndef HSDP_TESTS_COMMON_PORTS_H_
#define HSDP_TESTS_COMMON_PORTS_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <set>

namespace hsdp::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read
// back and closed), never one this function handed out before in this
// process, so several servers of one test get distinct ports. 0 if no socket
// could be bound.
inline int FreePort() {
  static std::mutex mu;
  static std::set<int> handed_out;
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    if (port != 0 && handed_out.insert(port).second) return port;
  }
  return 0;
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_PORTS_H_
