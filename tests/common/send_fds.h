// Sending file descriptors over a Unix socket the way a hostile or careless
// peer would: any number of them in one message, whatever they are. The
// client's SendWithFds (hsdp/common/unix_socket.h) refuses more than
// kMaxFdsPerMessage, so tests of the receiving side need their own sender.
#ifndef HSDP_TESTS_COMMON_SEND_FDS_H_
#define HSDP_TESTS_COMMON_SEND_FDS_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <cstring>
#include <vector>

namespace hsdp::testing {

// Sends `len` bytes of `data` with `fds` attached (SCM_RIGHTS, none when
// empty) in one sendmsg, without SIGPIPE. Returns sendmsg's result.
inline ssize_t SendFdsRaw(int sock, const void* data, size_t len, const std::vector<int>& fds) {
  struct iovec iov{const_cast<void*>(data), len};
  struct msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    m.msg_control = control.data();
    m.msg_controllen = control.size();
    struct cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &m, MSG_NOSIGNAL);
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_SEND_FDS_H_
