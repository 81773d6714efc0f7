#include "daemon/server/listener.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "hsdp/common/logging.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr int64_t kMsNs = 1'000'000;
constexpr int64_t kSweepIntervalNs = 1000 * kMsNs;
// After running out of fds with no way to shed, accept again after this long.
constexpr int64_t kAcceptPauseNs = 100 * kMsNs;
// Connections accepted per wakeup before the loop serves the others.
constexpr int kAcceptBatch = 256;
// Per-connection warnings: at most one line per call site per this period.
constexpr double kWarnEverySec = 5;

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
    return absl::InvalidArgumentError(absl::StrCat("socket path must be absolute and 1 to ",
                                                   sizeof(addr.sun_path) - 1, " bytes: ", path));
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
  l->epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!l->epoll_fd_.valid()) return ErrnoStatus(errno, "epoll_create1", __FILE__, __LINE__);
  l->reserve_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
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
      return absl::FailedPreconditionError(
          absl::StrCat(lock_path, " is not a plain file owned by uid ", ::geteuid(),
                       " with a single link; remove it if no hsdpd is running"));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("another hsdpd (pid ", ReadPid(fd.get()), ") is already serving ", path_,
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
  return absl::UnavailableError(absl::StrCat(lock_path,
                                             " keeps being replaced; is another hsdpd "
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

void Listener::Start(const Options& options, PeerRegistry* peers, Handler on_grpc,
                     Handler on_data) {
  options_ = options;
  peers_ = peers;
  limiter_ = ConnectionLimiter::Create(options.max_connections_per_uid);
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
  pending_.clear();
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
  struct epoll_event ev{};
  ev.events = EPOLLIN;
  for (const int fd : {wake_fd_.get(), listen_fd_.get()}) {
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      HSDP_LOG(Error) << "epoll_ctl on the listening socket failed: " << std::strerror(errno);
      return;
    }
  }
  int64_t next_sweep = shm::NowNanos() + kSweepIntervalNs;
  int64_t next_deadline = INT64_MAX;
  struct epoll_event events[64];
  for (;;) {
    int64_t wake_at = std::min(next_sweep, next_deadline);
    if (accept_paused_until_ != 0) wake_at = std::min(wake_at, accept_paused_until_);
    const int64_t wait_ns = std::max<int64_t>(0, wake_at - shm::NowNanos());
    const int timeout_ms = static_cast<int>(std::min<int64_t>(1000, (wait_ns + kMsNs - 1) / kMsNs));
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, timeout_ms);
    if (n < 0 && errno != EINTR) {
      HSDP_LOG(Error) << "epoll_wait on the listening socket failed: " << std::strerror(errno);
      return;
    }
    int64_t now = shm::NowNanos();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_.get()) return;
      if (fd == listen_fd_.get()) {
        AcceptAll(now);
      } else {
        TryRoute(fd, events[i].events);
      }
    }
    now = shm::NowNanos();
    if (accept_paused_until_ != 0 && now >= accept_paused_until_) {
      accept_paused_until_ = 0;
      ev.events = EPOLLIN;
      ev.data.fd = listen_fd_.get();
      ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
    }
    next_deadline = ExpirePending(now);
    if (now >= next_sweep) {
      peers_->Sweep();
      next_sweep = now + kSweepIntervalNs;
    }
  }
}

void Listener::AcceptAll(int64_t now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Admit(UniqueFd(fd), now);
      continue;
    }
    switch (errno) {
      case EAGAIN:
        return;
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
        continue;
      case EMFILE:
      case ENFILE:
        if (ShedOneConnection()) continue;
        PauseAccepting(now);
        return;
      default:  // ENOBUFS, ENOMEM, ...: let memory come back
        HSDP_LOG_EVERY_N_SEC(Error, kWarnEverySec)
            << "accept on " << path_ << " failed: " << std::strerror(errno)
            << "; pausing new connections for " << kAcceptPauseNs / kMsNs << " ms";
        PauseAccepting(now);
        return;
    }
  }
}

bool Listener::ShedOneConnection() {
  const int err = errno;
  bool shed = false;
  if (reserve_fd_.valid()) {
    reserve_fd_.Reset();
    UniqueFd victim(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    shed = victim.valid();
    victim.Reset();
    reserve_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  if (shed) {
    HSDP_LOG_EVERY_N_SEC(Error, kWarnEverySec)
        << "out of file descriptors (" << std::strerror(err)
        << "): closing new connections at once; raise the fd limit (LimitNOFILE) or lower "
           "limits.max_connections_per_uid";
  } else {
    HSDP_LOG_EVERY_N_SEC(Error, kWarnEverySec)
        << "out of file descriptors (" << std::strerror(err) << "): pausing new connections for "
        << kAcceptPauseNs / kMsNs << " ms; raise the fd limit (LimitNOFILE) or lower "
        << "limits.max_connections_per_uid";
  }
  return shed && reserve_fd_.valid();
}

void Listener::PauseAccepting(int64_t now) {
  if (accept_paused_until_ != 0) return;
  accept_paused_until_ = now + kAcceptPauseNs;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
}

void Listener::Admit(UniqueFd fd, int64_t now) {
  absl::StatusOr<PeerCred> cred = GetPeerCred(fd.get());
  if (!cred.ok()) return;
  std::optional<ConnectionSlot> slot = limiter_->TryAcquire(cred->uid);
  if (!slot.has_value()) {
    peers_->Sweep();  // gRPC connections that closed since the last sweep
    slot = limiter_->TryAcquire(cred->uid);
  }
  if (!slot.has_value()) {
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "uid " << cred->uid << " (pid " << cred->pid << ") already has "
        << limiter_->Live(cred->uid) << " connections to " << path_
        << " (limits.max_connections_per_uid = " << limiter_->max_per_uid()
        << "); closing the new one";
    return;
  }
  // Edge-triggered: a connection that sent fewer than 8 bytes wakes us only
  // when more arrive (or it hangs up), never in a loop. Bytes that arrived
  // before the add are reported at once.
  struct epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  ev.data.fd = fd.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
    HSDP_LOG_EVERY_N_SEC(Error, kWarnEverySec)
        << "epoll_ctl for a new connection failed: " << std::strerror(errno);
    return;
  }
  const int raw = fd.get();
  const int64_t deadline = now + int64_t{options_.hello_timeout_ms} * kMsNs;
  pending_[raw] = Pending{std::move(fd), *cred, std::move(*slot), deadline};
}

void Listener::TryRoute(int fd, uint32_t events) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  char head[8];
  const ssize_t n = ::recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(sizeof(head))) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
    Pending p = std::move(it->second);
    pending_.erase(it);
    Accepted conn{std::move(p.fd), p.cred, std::move(p.slot), p.deadline_ns};
    if (std::memcmp(head, shm::kDataHelloMagic, sizeof(head)) == 0) {
      on_data_(std::move(conn));
    } else {
      on_grpc_(std::move(conn));
    }
    return;
  }
  const bool waiting = n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  // A peer that hung up before 8 bytes can never complete them.
  if (waiting && (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  pending_.erase(it);  // closes it
}

int64_t Listener::ExpirePending(int64_t now) {
  int64_t earliest = INT64_MAX;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now < it->second.deadline_ns) {
      earliest = std::min(earliest, it->second.deadline_ns);
      ++it;
      continue;
    }
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "closing a connection from uid " << it->second.cred.uid << " (pid "
        << it->second.cred.pid
        << "): it sent fewer than 8 bytes within timeouts.hello_ms = " << options_.hello_timeout_ms
        << " ms";
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->first, nullptr);
    it = pending_.erase(it);  // closes it
  }
  return earliest;
}

}  // namespace hsdp
