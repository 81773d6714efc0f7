#include "daemon/server/listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr int64_t kRouteTimeoutNs = 5'000'000'000;  // a client must speak within 5 s

absl::Status MakeParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string dir = path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) return absl::OkStatus();
  RETURN_IF_ERROR(MakeParentDir(dir));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", dir), __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

std::string ReadPid(int fd) {
  char buf[32] = {0};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "unknown";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& path, uint32_t mode) {
  std::unique_ptr<Listener> l(new Listener());
  l->path_ = path;
  l->lock_path_ = path + ".lock";
  struct sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path must be 1 to ", sizeof(addr.sun_path) - 1, " bytes: ", path));
  }
  RETURN_IF_ERROR(MakeParentDir(path));

  // The lock file decides who owns the socket; the kernel drops the lock
  // when its holder dies, so a crashed daemon never blocks a restart.
  l->lock_fd_.Reset(::open(l->lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!l->lock_fd_.valid()) {
    return ErrnoStatus(errno, absl::StrCat("open ", l->lock_path_), __FILE__, __LINE__);
  }
  if (::flock(l->lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    const std::string pid = ReadPid(l->lock_fd_.get());
    l->lock_fd_.Reset();
    l->lock_path_.clear();  // not ours to remove
    return absl::FailedPreconditionError(absl::StrCat(
        "another hsdpd (pid ", pid, ") is already serving ", path,
        "; stop it first or pass a different --socket"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(l->lock_fd_.get(), 0) != 0 ||
      ::pwrite(l->lock_fd_.get(), pid.data(), pid.size(), 0) < 0) {
    HSDP_LOG(Warning) << "cannot write pid to " << l->lock_path_;
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    HSDP_LOG(Warning) << "replacing stale socket " << path << " left by an earlier hsdpd";
    ::unlink(path.c_str());
  }

  l->listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!l->listen_fd_.valid()) return ErrnoStatus(errno, "socket", __FILE__, __LINE__);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Create the socket with no permissions for others from the start.
  const mode_t old_umask = ::umask(0177);
  const int rc = ::bind(l->listen_fd_.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  ::umask(old_umask);
  if (rc != 0) return ErrnoStatus(errno, absl::StrCat("bind ", path), __FILE__, __LINE__);
  SYSCALL_OR_RETURN(::chmod(path.c_str(), mode));
  SYSCALL_OR_RETURN(::listen(l->listen_fd_.get(), 512));
  l->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!l->wake_fd_.valid()) return ErrnoStatus(errno, "eventfd", __FILE__, __LINE__);
  return l;
}

Listener::~Listener() { Stop(); }

void Listener::Start(Handler on_grpc, Handler on_data) {
  on_grpc_ = std::move(on_grpc);
  on_data_ = std::move(on_data);
  thread_ = std::thread([this] { Loop(); });
}

void Listener::Stop() {
  if (stopped_.exchange(true)) return;
  if (wake_fd_.valid()) {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
    (void)ignored;
  }
  if (thread_.joinable()) thread_.join();
  listen_fd_.Reset();
  if (!path_.empty() && lock_fd_.valid()) ::unlink(path_.c_str());
  if (!lock_path_.empty() && lock_fd_.valid()) ::unlink(lock_path_.c_str());
  lock_fd_.Reset();
}

void Listener::Loop() {
  struct Pending {
    UniqueFd fd;
    PeerCred cred;
    int64_t deadline;
  };
  std::vector<Pending> pending;
  for (;;) {
    std::vector<struct pollfd> pfds = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    for (const Pending& p : pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    const int rc = ::poll(pfds.data(), pfds.size(), pending.empty() ? -1 : 100);
    if (rc < 0 && errno != EINTR) {
      HSDP_LOG(Error) << "poll on the listening socket failed: " << std::strerror(errno);
      return;
    }
    if (pfds[1].revents != 0) return;
    // Route connections that spoke (or gave up).
    const int64_t now = shm::NowNanos();
    std::vector<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (pfds[i + 2].revents == 0) {
        if (now < p.deadline) still.push_back(std::move(p));
        continue;
      }
      char head[8];
      const ssize_t n = ::recv(p.fd.get(), head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
      if (n <= 0 && !(n < 0 && errno == EAGAIN)) continue;  // closed: drop
      if (n < static_cast<ssize_t>(sizeof(head))) {
        if (now < p.deadline) still.push_back(std::move(p));
        continue;
      }
      if (std::memcmp(head, shm::kDataHelloMagic, sizeof(head)) == 0) {
        on_data_(std::move(p.fd), p.cred);
      } else {
        on_grpc_(std::move(p.fd), p.cred);
      }
    }
    pending = std::move(still);
    if (pfds[0].revents & POLLIN) {
      for (;;) {
        UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd.valid()) break;
        absl::StatusOr<PeerCred> cred = GetPeerCred(fd.get());
        if (!cred.ok()) continue;
        pending.push_back(Pending{std::move(fd), *cred, shm::NowNanos() + kRouteTimeoutNs});
      }
    }
  }
}

}  // namespace hsdp
