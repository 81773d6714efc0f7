#include "daemon/server/data_conn_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cstring>

#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

constexpr int kReadTimeoutMs = 1000;

void Reply(int fd, absl::StatusCode code, const std::string& message, uint64_t channel_bytes,
           uint64_t node_bytes, const std::vector<int>& fds) {
  shm::DataHelloReply r{};
  r.code = static_cast<int32_t>(code);
  r.message_len = static_cast<uint32_t>(std::min(message.size(), sizeof(r.message)));
  std::memcpy(r.message, message.data(), r.message_len);
  r.channel_bytes = channel_bytes;
  r.node_page_bytes = node_bytes;
  (void)SendWithFds(fd, &r, sizeof(r), fds);
}

}  // namespace

DataConnServer::DataConnServer(SessionManager* sessions, const NodePage* node_page,
                               UidCheck allowed)
    : sessions_(sessions), node_page_(node_page), allowed_(std::move(allowed)) {}

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
  conns_.clear();
}

void DataConnServer::Adopt(Listener::Accepted conn) {
  {
    std::lock_guard<std::mutex> l(mu_);
    adopted_.push_back(std::move(conn));
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

void DataConnServer::Drop(int fd, const char* why) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  const uint64_t session_id = it->second.session_id;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  conns_.erase(it);  // closes the fd
  if (session_id != 0) sessions_->EndSession(session_id, why);
}

void DataConnServer::Hello(Conn& c, bool* drop) {
  shm::DataHello hello{};
  absl::Status s = RecvWithFds(c.fd.get(), &hello, sizeof(hello), nullptr, kReadTimeoutMs);
  if (!s.ok()) {
    *drop = true;
    return;
  }
  if (std::memcmp(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic)) != 0 ||
      hello.version != shm::kLayoutVersion) {
    Reply(c.fd.get(), absl::StatusCode::kFailedPrecondition,
          absl::StrCat("data connection: this hsdpd speaks layout version ", shm::kLayoutVersion,
                       ", the client sent ", hello.version),
          0, 0, {});
    *drop = true;
    return;
  }
  if (!allowed_(c.cred.uid)) {
    Reply(c.fd.get(), absl::StatusCode::kPermissionDenied,
          absl::StrCat("uid ", c.cred.uid, " is not allowed to use this hsdpd (node.allowed_uids)"),
          0, 0, {});
    *drop = true;
    return;
  }
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->ClaimSession(hello.session_id, hello.token, c.cred);
  if (!session.ok()) {
    Reply(c.fd.get(), session.status().code(), std::string(session.status().message()), 0, 0, {});
    *drop = true;
    return;
  }
  c.session_id = hello.session_id;
  const SharedRegion& ch = (*session)->channel().region();
  Reply(c.fd.get(), absl::StatusCode::kOk, "", ch.bytes(), node_page_->region().bytes(),
        {ch.fd(), node_page_->region().fd()});
}

void DataConnServer::OnReadable(Conn& c, bool* drop) {
  if (c.session_id == 0) return Hello(c, drop);
  shm::FdMessage msg{};
  std::vector<UniqueFd> fds;
  absl::Status s = RecvWithFds(c.fd.get(), &msg, sizeof(msg), &fds, kReadTimeoutMs);
  if (!s.ok()) {
    *drop = true;  // EOF: the client went away
    return;
  }
  if (msg.magic != shm::kFdMessageMagic || fds.size() != 1 || msg.fd_tag == 0) {
    HSDP_LOG(Warning) << "session " << c.session_id
                      << ": malformed message on the data connection; ending the session";
    *drop = true;
    return;
  }
  if (std::shared_ptr<Session> s = sessions_->FindSession(c.session_id); s != nullptr) {
    s->PutFd(msg.fd_tag, std::move(fds[0]));
  }
}

void DataConnServer::Loop() {
  struct epoll_event events[64];
  while (!stop_.load()) {
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, 200);
    const int64_t now = shm::NowNanos();
    {
      std::vector<Listener::Accepted> adopted;
      {
        std::lock_guard<std::mutex> l(mu_);
        adopted.swap(adopted_);
      }
      for (Listener::Accepted& a : adopted) {
        const int raw = a.fd.get();
        struct epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.fd = raw;
        if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;
        conns_[raw] = Conn{std::move(a.fd), a.cred, 0, a.hello_deadline_ns, std::move(a.slot)};
      }
    }
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
      bool drop = false;
      if (events[i].events & EPOLLIN) OnReadable(it->second, &drop);
      if (!drop && (events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) &&
          !(events[i].events & EPOLLIN)) {
        drop = true;
      }
      if (drop) Drop(fd, "client process exited or closed its connection");
    }
    // Connections that never said hello.
    std::vector<int> late;
    for (auto& [fd, c] : conns_) {
      if (c.session_id == 0 && now > c.deadline_ns) late.push_back(fd);
    }
    for (int fd : late) Drop(fd, "no hello");
  }
}

}  // namespace hsdp
