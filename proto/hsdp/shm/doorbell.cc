#include "hsdp/shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace hsdp::shm {
namespace {

// Shared (not FUTEX_PRIVATE) futexes: the word lives in memory mapped by
// several processes.
long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const struct timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

}  // namespace

int64_t NowNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void RingDoorbell(Doorbell* bell) {
  bell->seq.fetch_add(1, std::memory_order_seq_cst);
  if (bell->waiters.load(std::memory_order_seq_cst) != 0) {
    Futex(&bell->seq, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

void SleepOnDoorbell(Doorbell* bell, uint32_t observed, int64_t timeout_ns) {
  bell->waiters.fetch_add(1, std::memory_order_seq_cst);
  struct timespec ts;
  const struct timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    tsp = &ts;
  }
  // The kernel re-checks seq == observed atomically, so a Ring() between our
  // load and this call is never lost. EINTR/EAGAIN/ETIMEDOUT all just return.
  Futex(&bell->seq, FUTEX_WAIT, observed, tsp);
  bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace hsdp::shm
