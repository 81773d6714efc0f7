#include "hsdp/common/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "hsdp/common/status_macros.h"

namespace hsdp {

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path) {
  struct sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path is ", path.size(), " bytes, the limit is ",
                     sizeof(addr.sun_path) - 1, ": ", path));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)", __FILE__, __LINE__);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  } while (rc == -1 && errno == EINTR);
  if (rc == -1) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("cannot connect to hsdpd at ", path, ": ",
                                               std::strerror(err)));
  }
  return fd;
}

absl::Status SendWithFds(int sock, const void* data, size_t len, const std::vector<int>& fds) {
  const char* p = static_cast<const char*>(data);
  bool first = true;
  while (len > 0) {
    struct iovec iov{const_cast<char*>(p), len};
    struct msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    if (first && !fds.empty()) {
      if (fds.size() > kMaxFdsPerMessage) {
        return absl::InvalidArgumentError(
            absl::StrCat("at most ", kMaxFdsPerMessage, " fds per message"));
      }
      const size_t fd_bytes = sizeof(int) * fds.size();
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(fd_bytes);
      struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fd_bytes);
      std::memcpy(CMSG_DATA(c), fds.data(), fd_bytes);
    }
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "sendmsg", __FILE__, __LINE__);
    }
    first = false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

namespace {

// Moves the SCM_RIGHTS fds of `msg` into `fds` (closing them when `fds` is
// null); returns how many arrived. Every fd is owned from here on, so none
// can leak whatever the caller decides next.
size_t TakeFds(struct msghdr* msg, std::vector<UniqueFd>* fds) {
  size_t taken = 0;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      UniqueFd owned(fd);
      if (fds != nullptr) fds->push_back(std::move(owned));
      ++taken;
    }
  }
  return taken;
}

}  // namespace

absl::StatusOr<size_t> RecvSomeWithFds(int sock, void* data, size_t len,
                                       std::vector<UniqueFd>* fds) {
  struct iovec iov{data, len};
  struct msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return ErrnoStatus(errno, "recvmsg", __FILE__, __LINE__);
  }
  std::vector<UniqueFd> received;
  TakeFds(&msg, &received);
  if (msg.msg_flags & MSG_CTRUNC) {
    // Some fds were dropped by the kernel: the message cannot be trusted.
    return absl::InvalidArgumentError(absl::StrCat(
        "more than ", kMaxFdsPerMessage, " file descriptors (or other control data) in one "
        "message; all of them were closed"));
  }
  if (n == 0) return absl::UnavailableError("connection closed by peer");
  if (fds != nullptr) {
    for (UniqueFd& fd : received) fds->push_back(std::move(fd));
  }
  return static_cast<size_t>(n);
}

absl::Status RecvWithFds(int sock, void* data, size_t len, std::vector<UniqueFd>* fds,
                         int timeout_ms) {
  char* p = static_cast<char*>(data);
  std::vector<UniqueFd> received;
  while (len > 0) {
    if (timeout_ms >= 0) {
      struct pollfd pfd{sock, POLLIN, 0};
      int rc = ::poll(&pfd, 1, timeout_ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "poll", __FILE__, __LINE__);
      }
      if (rc == 0) return absl::DeadlineExceededError("timed out reading from the socket");
    }
    struct iovec iov{p, len};
    struct msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "recvmsg", __FILE__, __LINE__);
    }
    TakeFds(&msg, fds != nullptr ? &received : nullptr);
    if (msg.msg_flags & MSG_CTRUNC) {
      // `received` closes everything that did arrive.
      return absl::InvalidArgumentError("too many file descriptors in one message");
    }
    if (n == 0) return absl::UnavailableError("connection closed by peer");
    p += n;
    len -= static_cast<size_t>(n);
  }
  if (fds != nullptr) {
    for (UniqueFd& fd : received) fds->push_back(std::move(fd));
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerCred> GetPeerCred(int sock) {
  struct ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)", __FILE__, __LINE__);
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

}  // namespace hsdp
