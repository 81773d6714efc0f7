// A node-wide pool with a share per uid: the node has `total` units of
// something the daemon hands out (sessions, arena bytes, placement waits),
// and one uid other than root may hold at most `share_percent` of them at
// once, so that no single local user can take a node-wide resource whole
// (limits.uid_share_percent). Root is held only to the node's total: an
// operator's process is not a tenant.
//
// Take reserves atomically (the check and the reservation under one lock);
// every Take is paired with a Give of the same uid and amount.
//
// Thread-safety: thread-safe; the lock is a leaf (nothing is called under it).
#ifndef HSDP_DAEMON_UTIL_UID_SHARE_H_
#define HSDP_DAEMON_UTIL_UID_SHARE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace hsdp {

// What one uid other than root may hold of `total` with `share_percent`
// (1..100): at least 1 when total > 0, so a small pool stays usable.
uint64_t UidShareOf(uint64_t total, uint32_t share_percent);

class UidSharedPool {
 public:
  // `what` names the pool in refusals ("arena memory (data_plane.small_op_arena_mib)"),
  // `unit` its unit ("bytes", "sessions").
  UidSharedPool(std::string what, std::string unit, uint64_t total, uint32_t share_percent);

  // Reserves `n` for `uid`, or RESOURCE_EXHAUSTED naming the node's limit or
  // the uid's share (limits.uid_share_percent), whichever refused.
  absl::Status Take(uint32_t uid, uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns what a Take of `uid` reserved.
  void Give(uint32_t uid, uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t total() const { return total_; }
  uint64_t per_uid() const { return per_uid_; }
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used_by(uint32_t uid) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string what_;
  const std::string unit_;
  const uint64_t total_;
  const uint32_t share_percent_;
  const uint64_t per_uid_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, uint64_t> by_uid_ ABSL_GUARDED_BY(mu_);  // only uids holding some
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_UID_SHARE_H_
