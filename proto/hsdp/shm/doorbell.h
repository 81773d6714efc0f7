// Doorbells: wake a sleeper in another process through a futex on a shared
// word, after a bounded spin. Idle waiters burn no CPU; busy ones see a ring
// within a microsecond or two.
#ifndef HSDP_SHM_DOORBELL_H_
#define HSDP_SHM_DOORBELL_H_

#include <sched.h>

#include <cstdint>

#include "hsdp/shm/layout.h"

namespace hsdp::shm {

// Monotonic clock in nanoseconds.
int64_t NowNanos();

// Ring: bump the sequence and wake sleepers (one syscall only if any sleep).
// Thread-safe, lock-free, never blocks.
void RingDoorbell(Doorbell* bell);

// Sleeps until `bell->seq` differs from `observed` or `timeout_ns` passes
// (negative = no timeout). Spurious returns are possible; callers re-check
// their condition. Never spins.
void SleepOnDoorbell(Doorbell* bell, uint32_t observed, int64_t timeout_ns);

// After the `i`-th failed poll (counting from 1) of a spin in `mode`
// (SpinMode): pauses, or yields the CPU. Returns true when it yielded (the
// caller then also looks at the clock, as it does every 64 polls).
inline bool SpinOnce(uint32_t mode, uint32_t i) {
  if (mode != kSpinPause && i > kPollsBeforeYield) {
    sched_yield();
    return true;
  }
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
  return false;
}

// Waits until `ready()` returns true, spinning up to `spin_ns` (SpinOnce in
// `mode`), then sleeping on `bell`. Returns true when ready, false when
// `deadline_ns` (NowNanos() scale, negative = none) passed first. `ready`
// must be cheap and is called from this thread only.
template <typename Ready>
bool AwaitDoorbell(Doorbell* bell, Ready&& ready, int64_t spin_ns, int64_t deadline_ns,
                   uint32_t mode = kSpinYield) {
  if (ready()) return true;
  const int64_t spin_until = NowNanos() + spin_ns;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if (SpinOnce(mode, i) || (i & 63) == 0) {
      const int64_t now = NowNanos();
      if (deadline_ns >= 0 && now >= deadline_ns) return ready();
      if (now >= spin_until) break;
    }
  }
  for (;;) {
    const uint32_t observed = bell->seq.load(std::memory_order_acquire);
    if (ready()) return true;
    int64_t timeout = -1;
    if (deadline_ns >= 0) {
      timeout = deadline_ns - NowNanos();
      if (timeout <= 0) return ready();
    }
    SleepOnDoorbell(bell, observed, timeout);
  }
}

}  // namespace hsdp::shm

#endif  // HSDP_SHM_DOORBELL_H_
