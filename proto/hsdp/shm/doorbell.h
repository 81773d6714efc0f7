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

// Waits until `ready()` returns true, spinning up to `spin_ns`, then sleeping
// on `bell`. Returns true when ready, false when `deadline_ns` (NowNanos()
// scale, negative = none) passed first. `ready` must be cheap and is called
// from this thread only. `mode` (SpinMode) says how the spin shares the CPU.
template <typename Ready>
bool AwaitDoorbell(Doorbell* bell, Ready&& ready, int64_t spin_ns, int64_t deadline_ns,
                   uint32_t mode = kSpinDefault) {
  if (ready()) return true;
  const int64_t spin_until = NowNanos() + spin_ns;
  // Polls between two yields, minus one (a mask); 0: yield after every poll.
  const uint32_t yield_mask = mode == kSpinYield ? 0u : 63u;
  for (uint32_t i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 0) {
      const int64_t now = NowNanos();
      if (deadline_ns >= 0 && now >= deadline_ns) return false;
      if (now >= spin_until) break;
    }
    if (mode != kSpinPause && (i & yield_mask) == 0) {
      // With more spinners than cores (trainers + the daemon on a small
      // node), give the CPU to whoever will make `ready` true.
      sched_yield();
      continue;
    }
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
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
