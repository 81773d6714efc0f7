#include "daemon/util/uid_share.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hsdp {

uint64_t UidShareOf(uint64_t total, uint32_t share_percent) {
  const uint32_t pct = std::clamp<uint32_t>(share_percent, 1, 100);
  if (total == 0) return 0;
  // total / 100 * pct + (total % 100) * pct / 100: no overflow for any total.
  const uint64_t share = total / 100 * pct + total % 100 * pct / 100;
  return std::max<uint64_t>(share, 1);
}

UidSharedPool::UidSharedPool(std::string what, std::string unit, uint64_t total,
                             uint32_t share_percent)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      share_percent_(std::clamp<uint32_t>(share_percent, 1, 100)),
      per_uid_(UidShareOf(total, share_percent)) {}

absl::Status UidSharedPool::Take(uint32_t uid, uint64_t n) {
  absl::MutexLock l(&mu_);
  if (n > total_ || used_ > total_ - n) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this node's ", what_, " is used up: ", used_, " of ", total_, " ", unit_,
        " held, ", n, " more asked"));
  }
  auto it = by_uid_.find(uid);
  const uint64_t held = it == by_uid_.end() ? 0 : it->second;
  if (uid != 0 && (n > per_uid_ || held > per_uid_ - n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " already holds ", held, " of its share of ", per_uid_, " ", unit_,
        " of this node's ", what_, " (", share_percent_, "% of ", total_,
        ", limits.uid_share_percent); ", n, " more asked"));
  }
  by_uid_[uid] = held + n;
  used_ += n;
  return absl::OkStatus();
}

void UidSharedPool::Give(uint32_t uid, uint64_t n) {
  absl::MutexLock l(&mu_);
  auto it = by_uid_.find(uid);
  const uint64_t held = it == by_uid_.end() ? 0 : it->second;
  const uint64_t back = std::min(n, held);  // never below zero, whatever a caller does
  used_ -= std::min(back, used_);
  if (it != by_uid_.end()) {
    it->second -= back;
    if (it->second == 0) by_uid_.erase(it);
  }
}

uint64_t UidSharedPool::used() const {
  absl::MutexLock l(&mu_);
  return used_;
}

uint64_t UidSharedPool::used_by(uint32_t uid) const {
  absl::MutexLock l(&mu_);
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second;
}

}  // namespace hsdp
