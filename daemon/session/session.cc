#include "daemon/session/session.h"

#include <cstring>

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

void Session::PutFd(uint64_t tag, UniqueFd fd) {
  absl::MutexLock l(&mu_);
  if (pending_fds_.size() >= kMaxPendingFds) pending_fds_.erase(pending_fds_.begin());
  pending_fds_[tag] = std::move(fd);
}

absl::StatusOr<UniqueFd> Session::TakeFd(uint64_t tag, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_fds_.count(tag) > 0; };
  mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  auto it = pending_fds_.find(tag);
  if (it == pending_fds_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "fd_tag: no file descriptor tagged ", tag, " arrived on the session's data connection"));
  }
  UniqueFd fd = std::move(it->second);
  pending_fds_.erase(it);
  return fd;
}

uint64_t Session::AddBuffer(std::shared_ptr<MappedBuffer> buffer) {
  absl::MutexLock l(&mu_);
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
  absl::MutexLock l(&mu_);
  const uint64_t bytes = buffer_bytes_;
  buffers_.clear();
  pending_fds_.clear();
  buffer_bytes_ = 0;
  return bytes;
}

void Session::Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns,
                       uint64_t exec_ns) {
  (status.ok() ? ops_completed_ : ops_failed_).fetch_add(1, std::memory_order_relaxed);
  channel_->Complete(op_id, status, queued_ns, exec_ns);
}

void Session::Close() {
  if (closed_.exchange(true)) return;
  channel_->Close();
}

}  // namespace hsdp
