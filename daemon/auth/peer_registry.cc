#include "daemon/auth/peer_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace hsdp {

ConnectionSlot& ConnectionSlot::operator=(ConnectionSlot&& o) noexcept {
  if (this != &o) {
    Release();
    limiter_ = std::move(o.limiter_);
    uid_ = o.uid_;
  }
  return *this;
}

ConnectionSlot::~ConnectionSlot() { Release(); }

void ConnectionSlot::Release() {
  if (limiter_ == nullptr) return;
  limiter_->Release(uid_);
  limiter_.reset();
}

std::shared_ptr<ConnectionLimiter> ConnectionLimiter::Create(uint32_t max_per_uid) {
  return std::shared_ptr<ConnectionLimiter>(new ConnectionLimiter(max_per_uid));
}

std::optional<ConnectionSlot> ConnectionLimiter::TryAcquire(uid_t uid) {
  absl::MutexLock l(&mu_);
  uint32_t& live = live_[uid];
  if (uid != 0 && live >= max_per_uid_) return std::nullopt;
  ++live;
  return ConnectionSlot(shared_from_this(), uid);
}

uint32_t ConnectionLimiter::Live(uid_t uid) const {
  absl::MutexLock l(&mu_);
  auto it = live_.find(uid);
  return it == live_.end() ? 0 : it->second;
}

void ConnectionLimiter::Release(uid_t uid) {
  absl::MutexLock l(&mu_);
  auto it = live_.find(uid);
  if (it == live_.end()) return;
  if (--it->second == 0) live_.erase(it);
}

namespace {

// The (device, inode) of the file behind `fd`, or false. Sweep asks this of
// fds gRPC owns and may close at any moment (by design: gRPC has no hook
// for a closed connection, and a reused number is told apart by its inode).
// Through the raw statx system call: ThreadSanitizer treats fstat() of an
// fd another thread closes as a data race on the descriptor, and its report
// of that race aborted the daemon (a CHECK in TSan's report code, clang 14).
bool FileIdentity(int fd, dev_t* dev, ino_t* ino) {
  struct statx stx {};
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_INO, &stx) != 0) return false;
  *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
  *ino = stx.stx_ino;
  return true;
}

}  // namespace

PeerRegistry::PeerRegistry(std::vector<uint32_t> allowed_uids) {
  SetAllowed(std::move(allowed_uids));
}

void PeerRegistry::Add(int fd, const PeerCred& cred, ConnectionSlot slot) {
  Entry e;
  e.cred = cred;
  dev_t dev;
  ino_t ino;
  if (FileIdentity(fd, &dev, &ino)) {
    e.dev = dev;
    e.ino = ino;
  }
  e.slot = std::move(slot);
  ConnectionSlot replaced;  // released after the lock is dropped
  absl::MutexLock l(&mu_);
  auto [it, inserted] = by_fd_.try_emplace(fd);
  if (!inserted) replaced = std::move(it->second.slot);  // the old connection closed
  it->second = std::move(e);
}

size_t PeerRegistry::Sweep() {
  std::vector<ConnectionSlot> released;  // destroyed after the lock is dropped
  absl::MutexLock l(&mu_);
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    // gRPC may close the fd at any moment: a live connection keeps its fd
    // and inode, so it is never dropped by mistake; a closed one is noticed
    // by this sweep or the next.
    const Entry& e = it->second;
    dev_t dev;
    ino_t ino;
    if (FileIdentity(it->first, &dev, &ino) && dev == e.dev && ino == e.ino) {
      ++it;
      continue;
    }
    released.push_back(std::move(it->second.slot));
    it = by_fd_.erase(it);
  }
  return released.size();
}

std::optional<PeerCred> PeerRegistry::Lookup(const std::string& peer) const {
  if (!absl::StartsWith(peer, "fd:")) return std::nullopt;
  int fd;
  if (!absl::SimpleAtoi(peer.substr(3), &fd)) return std::nullopt;
  absl::MutexLock l(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second.cred;
}

bool PeerRegistry::Allowed(uint32_t uid) const {
  absl::MutexLock l(&mu_);
  return std::find(allowed_.begin(), allowed_.end(), uid) != allowed_.end();
}

void PeerRegistry::SetAllowed(std::vector<uint32_t> allowed_uids) {
  if (allowed_uids.empty()) allowed_uids = {static_cast<uint32_t>(::getuid()), 0};
  absl::MutexLock l(&mu_);
  allowed_ = std::move(allowed_uids);
}

size_t PeerRegistry::size() const {
  absl::MutexLock l(&mu_);
  return by_fd_.size();
}

}  // namespace hsdp
