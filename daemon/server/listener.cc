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
#include "hsdp/common/socket_path.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr int64_t kRouteTimeoutNs = 5'000'000'000;  // a client must speak within 5 s

std::string ReadPid(int fd) {
  char buf[32] = {0};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "unknown";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& path, uint32_t mode) {
  std::unique_ptr<Listener> l(new Listener());
  struct sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path) || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path must be absolute and 1 to ", sizeof(addr.sun_path) - 1, " bytes: ", path));
  }
  const size_t slash = path.rfind('/');
  l->path_ = path;
  l->dir_ = slash == 0 ? "/" : path.substr(0, slash);
  l->name_ = path.substr(slash + 1);
  if (l->name_.empty() || l->name_ == "." || l->name_ == "..") {
    return absl::InvalidArgumentError(absl::StrCat("socket path has no file name: ", path));
  }
  l->lock_name_ = l->name_ + ".lock";
  absl::StatusOr<UniqueFd> dir = OpenTrustedDir(l->dir_);
  if (!dir.ok()) {
    return absl::Status(dir.status().code(),
                        absl::StrCat("socket directory for ", path, ": ", dir.status().message()));
  }
  l->dir_fd_ = std::move(*dir);
  RETURN_IF_ERROR(l->TakeLock());
  RETURN_IF_ERROR(l->BindSocket(mode));
  l->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!l->wake_fd_.valid()) return ErrnoStatus(errno, "eventfd", __FILE__, __LINE__);
  return l;
}

// The lock file decides who owns the socket; the kernel drops the lock when
// its holder dies, so a crashed daemon never blocks a restart.
absl::Status Listener::TakeLock() {
  const std::string lock_path = dir_ + "/" + lock_name_;
  for (int attempt = 0; attempt < 3; ++attempt) {
    UniqueFd fd(::openat(dir_fd_.get(), lock_name_.c_str(),
                         O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644));
    if (!fd.valid()) {
      if (errno == ELOOP) {
        return absl::FailedPreconditionError(
            absl::StrCat(lock_path, " is a symbolic link; refusing to follow it"));
      }
      return ErrnoStatus(errno, absl::StrCat("open ", lock_path), __FILE__, __LINE__);
    }
    struct stat st;
    SYSCALL_OR_RETURN(::fstat(fd.get(), &st));
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          lock_path, " is not a plain file owned by uid ", ::geteuid(),
          " with a single link; remove it if no hsdpd is running"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another hsdpd (pid ", ReadPid(fd.get()), ") is already serving ", path_,
          "; stop it first or pass a different --socket"));
    }
    // A daemon that was stopping may have removed the file between our open
    // and our flock: then the lock guards nothing; take the new file.
    struct stat now;
    if (::fstatat(dir_fd_.get(), lock_name_.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 ||
        !SameFile(now, st)) {
      continue;
    }
    const std::string pid = absl::StrCat(::getpid(), "\n");
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
      HSDP_LOG(Warning) << "cannot write pid to " << lock_path;
    }
    lock_fd_ = std::move(fd);
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(lock_path, " keeps being replaced; is another hsdpd "
                                             "starting and stopping on it?"));
}

absl::Status Listener::BindSocket(uint32_t mode) {
  struct stat st;
  if (::fstatat(dir_fd_.get(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, " exists and is not a socket; refusing to replace it"));
    }
    // We hold the lock, so no live daemon owns it.
    HSDP_LOG(Warning) << "replacing stale socket " << path_ << " left by an earlier hsdpd";
    if (::unlinkat(dir_fd_.get(), name_.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("unlink ", path_), __FILE__, __LINE__);
    }
  }
  listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd_.valid()) return ErrnoStatus(errno, "socket", __FILE__, __LINE__);
  // Bind through the directory fd (/proc/self/fd/N/name) so the socket lands
  // in the directory we checked even if a path component is swapped now.
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string where = absl::StrCat("/proc/self/fd/", dir_fd_.get(), "/", name_);
  if (where.size() >= sizeof(addr.sun_path) || ::access("/proc/self/fd", X_OK) != 0) {
    where = path_;  // every component was checked by OpenTrustedDir
  }
  std::memcpy(addr.sun_path, where.data(), where.size());
  // Create the socket with no permissions for others from the start.
  const mode_t old_umask = ::umask(0177);
  const int rc = ::bind(listen_fd_.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (rc != 0) return ErrnoStatus(bind_errno, absl::StrCat("bind ", path_), __FILE__, __LINE__);
  SYSCALL_OR_RETURN(::fstatat(dir_fd_.get(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW));
  created_socket_ = true;
  socket_dev_ = st.st_dev;
  socket_ino_ = st.st_ino;
  // fchmodat follows symlinks, but the name is the socket we just made in a
  // directory only we (or root) can write.
  SYSCALL_OR_RETURN(::fchmodat(dir_fd_.get(), name_.c_str(), mode, 0));
  SYSCALL_OR_RETURN(::listen(listen_fd_.get(), 512));
  return absl::OkStatus();
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
  if (created_socket_) {
    // Never remove what another process put there since (or a socket a
    // later daemon bound after we lost the lock): only our inode.
    struct stat st;
    if (::fstatat(dir_fd_.get(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == socket_dev_ && st.st_ino == socket_ino_) {
      ::unlinkat(dir_fd_.get(), name_.c_str(), 0);
    }
    created_socket_ = false;
  }
  if (lock_fd_.valid()) {
    // Removed while still locked: a daemon that opened it meanwhile sees the
    // name gone after its flock and retries (TakeLock).
    ::unlinkat(dir_fd_.get(), lock_name_.c_str(), 0);
    lock_fd_.Reset();
  }
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
