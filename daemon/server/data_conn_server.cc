#include "daemon/server/data_conn_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

constexpr int kMaxWaitMs = 200;
// Messages read from one connection per wakeup, so that one busy client
// cannot keep the loop from the others (the fd stays readable; epoll is
// level-triggered here).
constexpr int kMessagesPerWakeup = 64;
// Per-connection warnings: at most one line per call site per this period.
constexpr double kWarnEverySec = 5;

void Reply(int fd, absl::StatusCode code, const std::string& message, uint64_t channel_bytes,
           uint64_t node_bytes, const std::vector<int>& fds) {
  shm::DataHelloReply r{};
  r.code = static_cast<int32_t>(code);
  r.message_len = static_cast<uint32_t>(std::min(message.size(), sizeof(r.message)));
  std::memcpy(r.message, message.data(), r.message_len);
  r.channel_bytes = channel_bytes;
  (void)node_bytes;
  (void)SendWithFds(fd, &r, sizeof(r), fds);
}

// Empty when `fd` is a memfd (the only kind a client may pass: a regular
// shmem file that supports seals and that /proc names "/memfd:..."), else
// what it is instead, for the log.
std::string NotAMemfd(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return "an fd that cannot be inspected";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISFIFO(st.st_mode)) return "a pipe";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (!S_ISREG(st.st_mode)) return "a device or special file";
  // Only shmem (memfd, tmpfs) files support seals.
  if (::fcntl(fd, F_GET_SEALS) < 0) return "a regular file that is not a memfd";
  char link[256];
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(proc.c_str(), link, sizeof(link) - 1);
  // Without /proc the seal check above has to do.
  if (n > 0 && std::string(link, static_cast<size_t>(n)).rfind("/memfd:", 0) != 0) {
    return "a shared-memory file that is not a memfd";
  }
  return "";
}

// Empty when `fd` may be a device-memory handle: a real cuMem POSIX-fd
// export (an anonymous inode or a driver file) or the fake device's memfd.
// Never a socket (it could be the connection itself and keep it open
// forever), a pipe, a directory or a plain file.
std::string NotADeviceHandle(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return "an fd that cannot be inspected";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISFIFO(st.st_mode)) return "a pipe";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISBLK(st.st_mode)) return "a block device";
  // Regular files: only shmem ones (memfds; the fake device's handles).
  if (S_ISREG(st.st_mode) && ::fcntl(fd, F_GET_SEALS) < 0) return "a regular file";
  return "";
}

}  // namespace

DataConnServer::DataConnServer(SessionManager* sessions, const WakeFd* wake,
                               UidCheck allowed)
    : sessions_(sessions), dispatcher_wake_(wake), allowed_(std::move(allowed)) {}

DataConnServer::~DataConnServer() { Stop(); }

absl::Status DataConnServer::Start() {
  epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return ErrnoStatus(errno, "epoll_create1", __FILE__, __LINE__);
  wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus(errno, "eventfd", __FILE__, __LINE__);
  struct epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_.get();
  SYSCALL_OR_RETURN(::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void DataConnServer::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_fd_.valid()) {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
    (void)ignored;
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock l(&send_mu_);
    session_conns_.clear();
  }
  conns_.clear();
  absl::MutexLock l(&mu_);
  adopted_.clear();
}

void DataConnServer::Adopt(Listener::Accepted conn) {
  {
    absl::MutexLock l(&mu_);
    adopted_.push_back(std::move(conn));
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

void DataConnServer::Drop(int fd, const std::string& why) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  const uint64_t session_id = it->second.session_id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (session_id != 0) {
    absl::MutexLock l(&send_mu_);
    session_conns_.erase(session_id);
  }
  conns_.erase(it);  // closes the fd and every fd it brought
  if (session_id != 0) sessions_->EndSession(session_id, why);
}

std::optional<std::string> DataConnServer::Hello(Conn& c) {
  shm::DataHello hello;
  std::memcpy(&hello, c.buf, sizeof(hello));
  if (std::memcmp(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic)) != 0 ||
      hello.version != shm::kLayoutVersion) {
    Reply(c.fd.get(), absl::StatusCode::kFailedPrecondition,
          absl::StrCat("data connection: this hsdpd speaks layout version ", shm::kLayoutVersion,
                       ", the client sent ", hello.version),
          0, 0, {});
    return "layout version mismatch";
  }
  if (!allowed_(c.cred.uid)) {
    Reply(c.fd.get(), absl::StatusCode::kPermissionDenied,
          absl::StrCat("uid ", c.cred.uid, " is not allowed to use this hsdpd (node.allowed_uids)"),
          0, 0, {});
    return "uid not allowed";
  }
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->ClaimSession(hello.session_id, hello.token, c.cred);
  if (!session.ok()) {
    Reply(c.fd.get(), session.status().code(), std::string(session.status().message()), 0, 0, {});
    return "session not claimed";
  }
  c.session_id = hello.session_id;
  const SharedRegion& ch = (*session)->channel().region();
  // The channel, and the dispatcher's wake-up eventfd (nothing else is shared).
  {
    // Before the reply: the client's next call (NewGroup) may send on it.
    absl::MutexLock l(&send_mu_);
    session_conns_[c.session_id] = c.fd.get();
  }
  Reply(c.fd.get(), absl::StatusCode::kOk, "", ch.bytes(), 0, {ch.fd(), dispatcher_wake_->fd()});
  return std::nullopt;
}

absl::Status DataConnServer::SendArena(uint64_t session_id, uint64_t fd_tag, int fd) {
  absl::MutexLock l(&send_mu_);  // the connection stays open while held
  auto it = session_conns_.find(session_id);
  if (it == session_conns_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " has no data connection"));
  }
  const shm::ArenaMessage msg{shm::kArenaMessageMagic, 0, fd_tag};
  absl::Status s = SendWithFds(it->second, &msg, sizeof(msg), {fd});
  if (!s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot send the group's arena on the data connection (the client does not read it?): ",
        s.message()));
  }
  return absl::OkStatus();
}

std::optional<std::string> DataConnServer::OnFdMessage(Conn& c) {
  shm::FdMessage msg;
  std::memcpy(&msg, c.buf, sizeof(msg));
  std::vector<UniqueFd> fds = std::move(c.fds);  // closed on return unless kept
  c.fds.clear();
  if (msg.magic != shm::kFdMessageMagic || fds.size() != 1 || msg.fd_tag == 0) {
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "session " << c.session_id << " (uid " << c.cred.uid << ", pid " << c.cred.pid
        << "): malformed message on the data connection (" << fds.size()
        << " fds); ending the session";
    return "malformed message on its data connection";
  }
  std::shared_ptr<Session> s = sessions_->FindSession(c.session_id);
  if (msg.kind == shm::kFdKindDeviceHandle) {
    // Device handles only from sessions that agreed to device memory (the
    // daemon runs a device engine and the client offered the feature).
    if (s == nullptr || (s->info().features & shm::kFeatureDeviceMemory) == 0) {
      HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
          << "session " << c.session_id << " (uid " << c.cred.uid << ", pid " << c.cred.pid
          << ") passed a device-memory handle without negotiating device memory; ending the "
          << "session";
      return "it passed a device-memory handle without negotiating device memory";
    }
    if (const std::string what = NotADeviceHandle(fds[0].get()); !what.empty()) {
      HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
          << "session " << c.session_id << " (uid " << c.cred.uid << ", pid " << c.cred.pid
          << ") passed " << what << " as a device-memory handle; closed it and ending the "
          << "session";
      return absl::StrCat("it passed ", what, " as a device-memory handle on its data connection");
    }
    s->PutFd(msg.fd_tag, std::move(fds[0]), Session::FdKind::kDeviceHandle);
    return std::nullopt;
  }
  if (msg.kind != shm::kFdKindMemfd) {
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "session " << c.session_id << " (uid " << c.cred.uid << ", pid " << c.cred.pid
        << "): fd message of unknown kind " << msg.kind << "; ending the session";
    return absl::StrCat("it sent an fd message of unknown kind ", msg.kind);
  }
  if (const std::string kind = NotAMemfd(fds[0].get()); !kind.empty()) {
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "session " << c.session_id << " (uid " << c.cred.uid << ", pid " << c.cred.pid
        << ") passed " << kind << " where only memfds are accepted; closed it and ending the "
        << "session";
    return absl::StrCat("it passed ", kind, " instead of a memfd on its data connection");
  }
  if (s != nullptr) s->PutFd(msg.fd_tag, std::move(fds[0]), Session::FdKind::kMemfd);
  return std::nullopt;
}

std::optional<std::string> DataConnServer::OnReadable(Conn& c) {
  for (int messages = 0; messages < kMessagesPerWakeup;) {
    const size_t size = c.session_id == 0 ? sizeof(shm::DataHello) : sizeof(shm::FdMessage);
    // Never read past the current message, so fds stay with their message
    // (the kernel delivers them with its first byte).
    absl::StatusOr<size_t> n = RecvSomeWithFds(c.fd.get(), c.buf + c.have, size - c.have, &c.fds);
    if (!n.ok()) {
      if (absl::IsUnavailable(n.status())) return "client process exited or closed its connection";
      HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
          << "data connection of uid " << c.cred.uid << " (pid " << c.cred.pid
          << "): " << n.status().message() << "; closing it";
      return std::string(n.status().message());
    }
    if (*n == 0) return std::nullopt;  // nothing more for now
    c.have += *n;
    // One fd per FdMessage, none with the hello: more is a violation, and
    // must not pile up while the rest of the message trickles in.
    if (c.fds.size() > (c.session_id == 0 ? 0u : 1u)) {
      HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
          << "data connection of uid " << c.cred.uid << " (pid " << c.cred.pid << ", session "
          << c.session_id << ") sent " << c.fds.size() << " file descriptors with "
          << (c.session_id == 0 ? "its hello" : "one message") << "; closing them and the "
          << "connection";
      return "too many file descriptors in one message on its data connection";
    }
    if (c.have < size) continue;
    c.have = 0;
    ++messages;
    std::optional<std::string> drop = c.session_id == 0 ? Hello(c) : OnFdMessage(c);
    if (drop.has_value()) return drop;
  }
  return std::nullopt;
}

void DataConnServer::AddAdopted() {
  std::vector<Listener::Accepted> adopted;
  {
    absl::MutexLock l(&mu_);
    adopted.swap(adopted_);
  }
  for (Listener::Accepted& a : adopted) {
    const int raw = a.fd.get();
    struct epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = raw;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;
    Conn& c = conns_[raw];
    c.fd = std::move(a.fd);
    c.cred = a.cred;
    c.slot = std::move(a.slot);
    c.hello_deadline_ns = a.hello_deadline_ns;
  }
}

int64_t DataConnServer::ExpireHellos(int64_t now) {
  int64_t earliest = INT64_MAX;
  std::vector<int> late;
  for (auto& [fd, c] : conns_) {
    if (c.session_id != 0) continue;
    if (now < c.hello_deadline_ns) {
      earliest = std::min(earliest, c.hello_deadline_ns);
      continue;
    }
    HSDP_LOG_EVERY_N_SEC(Warning, kWarnEverySec)
        << "closing a data connection from uid " << c.cred.uid << " (pid " << c.cred.pid
        << "): its hello was not complete within timeouts.hello_ms (" << c.have << " of "
        << sizeof(shm::DataHello) << " bytes)";
    late.push_back(fd);
  }
  for (int fd : late) Drop(fd, "no hello");
  return earliest;
}

void DataConnServer::Loop() {
  struct epoll_event events[64];
  int64_t next_deadline = INT64_MAX;
  while (!stop_.load()) {
    int timeout_ms = kMaxWaitMs;
    if (next_deadline != INT64_MAX) {
      const int64_t left_ns = std::max<int64_t>(0, next_deadline - shm::NowNanos());
      timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, (left_ns + 999'999) / 1'000'000));
    }
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, timeout_ms);
    AddAdopted();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_.get()) {
        uint64_t v;
        ssize_t ignored = ::read(wake_fd_.get(), &v, sizeof(v));
        (void)ignored;
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      std::optional<std::string> drop;
      if (events[i].events & EPOLLIN) drop = OnReadable(it->second);
      if (!drop.has_value() && (events[i].events & (EPOLLHUP | EPOLLERR)) &&
          !(events[i].events & EPOLLIN)) {
        drop = "client process exited or closed its connection";
      }
      if (drop.has_value()) Drop(fd, *drop);
    }
    next_deadline = ExpireHellos(shm::NowNanos());
  }
}

}  // namespace hsdp
