#include "daemon/server/peer_registry.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"

namespace hsdp {

PeerRegistry::PeerRegistry(std::vector<uint32_t> allowed_uids) : allowed_(std::move(allowed_uids)) {
  if (allowed_.empty()) allowed_ = {static_cast<uint32_t>(::getuid()), 0};
}

void PeerRegistry::Add(int fd, const PeerCred& cred) {
  absl::MutexLock l(&mu_);
  by_fd_[fd] = cred;
}

std::optional<PeerCred> PeerRegistry::Lookup(const std::string& peer) const {
  if (!absl::StartsWith(peer, "fd:")) return std::nullopt;
  int fd;
  if (!absl::SimpleAtoi(peer.substr(3), &fd)) return std::nullopt;
  absl::MutexLock l(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

bool PeerRegistry::Allowed(uint32_t uid) const {
  return std::find(allowed_.begin(), allowed_.end(), uid) != allowed_.end();
}

}  // namespace hsdp
