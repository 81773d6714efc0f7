#include "hsdp/shm/arena.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::shm {

void BreakArena(ArenaHeader* h, const absl::Status& why) {
  const uint32_t code = why.ok() ? static_cast<uint32_t>(absl::StatusCode::kAborted)
                                 : static_cast<uint32_t>(why.code());
  uint32_t unclaimed = 0;
  if (h->broken_claim.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
    const size_t n = std::min(why.message().size(), sizeof(h->reason));
    if (n > 0) std::memcpy(h->reason, why.message().data(), n);  // an OK status has no data
    h->reason_len = static_cast<uint32_t>(n);
    h->broken.store(code, std::memory_order_release);
  } else {
    // Someone else claimed it: a breaker that is still writing its reason
    // (its code wins), or a member that took the claim and never broke.
    // Either way the arena must read as broken from now on.
    uint32_t healthy = 0;
    h->broken.compare_exchange_strong(healthy, code, std::memory_order_acq_rel);
  }
  // After `broken` (a member that sees the freeze reads the code), before
  // the bell (a waiter that wakes sees the freeze).
  FreezeArena(h);
  RingDoorbell(&h->bell);
}

bool CommitArenaOp(ArenaHeader* h, uint64_t seq) {
  uint64_t st = h->settled.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t committed = st & ~kArenaFrozen;
    if (committed >= seq) return true;
    if ((st & kArenaFrozen) != 0) return false;
    const uint64_t want = seq & ~kArenaFrozen;  // a sequence never reaches bit 63
    if (h->settled.compare_exchange_weak(st, want, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
      return true;
    }
  }
}

void FreezeArena(ArenaHeader* h) { h->settled.fetch_or(kArenaFrozen, std::memory_order_acq_rel); }

bool ArenaFrozen(const ArenaHeader& h) {
  return (h.settled.load(std::memory_order_acquire) & kArenaFrozen) != 0;
}

absl::Status ArenaBrokenStatus(const ArenaHeader& h) {
  const uint32_t code = h.broken.load(std::memory_order_acquire);
  if (code == 0) return absl::OkStatus();
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat(
        "the group's small-operation arena holds a state neither hsdpd nor a member writes "
        "(broken word ", code, ": overwritten by a member?)"));
  }
  const size_t n = std::min<size_t>(ReadOnce(h.reason_len), sizeof(h.reason));
  std::string why(h.reason, n);
  for (char& ch : why) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  return absl::Status(static_cast<absl::StatusCode>(code), why);
}

void RetireArena(ArenaHeader* h) {
  BreakArena(h, absl::AbortedError("the group ended: hsdpd released its small-operation arena"));
  for (char& c : h->magic) __atomic_store_n(&c, 0, __ATOMIC_SEQ_CST);
}

bool ArenaRetired(const ArenaHeader& h) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (size_t i = 0; i < sizeof(h.magic); ++i) {
    if (__atomic_load_n(&h.magic[i], __ATOMIC_ACQUIRE) != kArenaMagic[i]) return true;
  }
  return false;
}

}  // namespace hsdp::shm
