#include "daemon/session/session.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hsdp {

// Pending fds a client may park without registering them.
constexpr size_t kMaxPendingFds = 64;

Session::Session(uint64_t id, SessionInfo info, SessionToken token,
                 std::unique_ptr<ShmChannel> channel)
    : id_(id),
      info_(std::move(info)),
      token_(token),
      channel_(std::move(channel)),
      created_(absl::Now()) {}

bool Session::TokenMatches(const uint8_t* token) const {
  uint8_t diff = 0;  // constant time
  for (size_t i = 0; i < token_.size(); ++i) diff |= token_[i] ^ token[i];
  return diff == 0;
}

double Session::AgeSeconds() const { return absl::ToDoubleSeconds(absl::Now() - created_); }

bool Session::MarkDataConnected(int64_t peer_pid) {
  bool expected = false;
  if (!data_connected_.compare_exchange_strong(expected, true)) return false;
  peer_pid_.store(peer_pid);
  return true;
}

namespace {
// Delivers `fd` to a waiter that expects `want`; the wrong kind is refused
// (and the fd closed), naming both.
void Deliver(Session::FdCallback& done, uint64_t tag, UniqueFd fd, Session::FdKind have,
             Session::FdKind want) {
  if (have != want) {
    auto name = [](Session::FdKind k) {
      return k == Session::FdKind::kMemfd ? "a host memfd (RegisterBuffer)"
                                          : "a device-memory handle (RegisterDeviceBuffer)";
    };
    done(absl::InvalidArgumentError(absl::StrCat("fd_tag: the fd tagged ", tag, " was passed as ",
                                                 name(have), ", not as ", name(want))));
    return;
  }
  done(std::move(fd));
}
}  // namespace

void Session::PutFd(uint64_t tag, UniqueFd fd, FdKind kind) {
  FdCallback done;
  FdKind want;
  {
    absl::MutexLock l(&mu_);
    if (ended_) return;
    auto it = fd_waiters_.find(tag);
    if (it == fd_waiters_.end()) {
      if (pending_fds_.size() >= kMaxPendingFds) pending_fds_.erase(pending_fds_.begin());
      pending_fds_[tag] = {std::move(fd), kind};
      return;
    }
    done = std::move(it->second.done);
    want = it->second.kind;
    fd_waiters_.erase(it);
  }
  Deliver(done, tag, std::move(fd), kind, want);
}

absl::Status Session::AwaitFd(uint64_t tag, absl::Time deadline, FdCallback done,
                             FdKind kind) {
  UniqueFd fd;
  FdKind have;
  {
    absl::MutexLock l(&mu_);
    if (ended_) return absl::NotFoundError(absl::StrCat("session_id: session ", id_, " ended"));
    auto it = pending_fds_.find(tag);
    if (it == pending_fds_.end()) {
      if (fd_waiters_.count(tag) > 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("fd_tag: a RegisterBuffer call for tag ", tag, " is already waiting"));
      }
      if (fd_waiters_.size() >= kMaxFdWaiters) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "session ", id_, " already has ", fd_waiters_.size(),
            " RegisterBuffer calls waiting for their file descriptors"));
      }
      fd_waiters_[tag] = FdWaiter{deadline, std::move(done), kind};
      return absl::OkStatus();
    }
    fd = std::move(it->second.first);
    have = it->second.second;
    pending_fds_.erase(it);
  }
  Deliver(done, tag, std::move(fd), have, kind);
  return absl::OkStatus();
}

void Session::ExpireFdWaiters(absl::Time now) {
  std::vector<std::pair<uint64_t, FdCallback>> expired;
  {
    absl::MutexLock l(&mu_);
    for (auto it = fd_waiters_.begin(); it != fd_waiters_.end();) {
      if (it->second.deadline <= now) {
        expired.emplace_back(it->first, std::move(it->second.done));
        it = fd_waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [tag, done] : expired) {
    done(absl::NotFoundError(absl::StrCat(
        "fd_tag: no file descriptor tagged ", tag, " arrived on the session's data connection")));
  }
}

absl::Status Session::ReserveBuffer(uint64_t bytes, uint64_t max_bytes, uint32_t max_buffers) {
  absl::MutexLock l(&mu_);
  const uint64_t used = buffer_bytes_ + reserved_bytes_;
  if (bytes > max_bytes || used > max_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a buffer of ", bytes, " bytes does not fit session ", id_, ": it holds ", used,
        " bytes (incl. registrations in progress) of limits.max_session_bytes = ", max_bytes));
  }
  if (buffers_.size() + reserved_count_ >= max_buffers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", id_, " already has ", buffers_.size() + reserved_count_,
        " buffers (incl. registrations in progress; limits.max_buffers_per_session = ",
        max_buffers, ")"));
  }
  reserved_bytes_ += bytes;
  ++reserved_count_;
  return absl::OkStatus();
}

uint64_t Session::used_bytes() const {
  absl::MutexLock l(&mu_);
  return buffer_bytes_ + reserved_bytes_;
}

void Session::ReleaseReservation(uint64_t bytes) {
  absl::MutexLock l(&mu_);
  reserved_bytes_ -= bytes;
  --reserved_count_;
}

uint64_t Session::AddBuffer(std::shared_ptr<MappedBuffer> buffer) {
  absl::MutexLock l(&mu_);
  if (ended_) return 0;
  const uint64_t id = next_buffer_id_++;
  buffer_bytes_ += buffer->size();
  buffers_[id] = std::move(buffer);
  return id;
}

absl::StatusOr<std::shared_ptr<MappedBuffer>> Session::RemoveBuffer(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer_id: unknown buffer ", id));
  }
  std::shared_ptr<MappedBuffer> b = std::move(it->second);
  buffers_.erase(it);
  buffer_bytes_ -= b->size();
  return b;
}

std::shared_ptr<MappedBuffer> Session::FindBuffer(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  return it == buffers_.end() ? nullptr : it->second;
}

uint32_t Session::buffer_count() const {
  absl::MutexLock l(&mu_);
  return static_cast<uint32_t>(buffers_.size());
}

uint64_t Session::buffer_bytes() const {
  absl::MutexLock l(&mu_);
  return buffer_bytes_;
}

uint64_t Session::ClearBuffers() {
  std::map<uint64_t, FdWaiter> waiters;
  uint64_t bytes;
  {
    absl::MutexLock l(&mu_);
    ended_ = true;
    bytes = buffer_bytes_;
    buffers_.clear();
    pending_fds_.clear();
    buffer_bytes_ = 0;
    waiters.swap(fd_waiters_);
  }
  for (auto& [tag, w] : waiters) {
    w.done(absl::NotFoundError(absl::StrCat("session_id: session ", id_, " ended")));
  }
  return bytes;
}

void Session::Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns,
                       uint64_t exec_ns, int32_t peer, uint64_t event_id) {
  (status.ok() ? ops_completed_ : ops_failed_).fetch_add(1, std::memory_order_relaxed);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (job_ops_ != nullptr) job_ops_->in_flight.fetch_sub(1, std::memory_order_relaxed);
  channel_->Complete(op_id, status, queued_ns, exec_ns, peer, event_id);
}

void Session::Close() {
  if (closed_.exchange(true)) return;
  channel_->Close();
}

}  // namespace hsdp
