// The monotonic time a component reads, as an interface, so that a test can
// decide what "now" is instead of racing the wall clock.
//
// Clock::Real() reads CLOCK_MONOTONIC in nanoseconds (the scale of
// shm::NowNanos, which clients use too). FakeClock is the tests' clock: it
// moves only when told, or by a fixed step on every read (a component that
// polls then sees time pass in a number of reads, not in scheduler luck).
#ifndef HSDP_DAEMON_UTIL_CLOCK_H_
#define HSDP_DAEMON_UTIL_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace hsdp {

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic scale (CLOCK_MONOTONIC for the real clock).
  virtual int64_t NowNanos() const = 0;
  // The process's real clock (never null, never destroyed).
  static const Clock* Real();
};

class FakeClock : public Clock {
 public:
  // Starts at `start_ns`; each read returns the time and then adds
  // `step_per_read_ns` (0: time moves only by Advance / Set).
  explicit FakeClock(int64_t start_ns = 1'000'000'000, int64_t step_per_read_ns = 0)
      : now_(start_ns), step_(step_per_read_ns) {}
  int64_t NowNanos() const override {
    return now_.fetch_add(step_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  void Advance(int64_t ns) { now_.fetch_add(ns, std::memory_order_relaxed); }
  void Set(int64_t ns) { now_.store(ns, std::memory_order_relaxed); }
  void SetStepPerRead(int64_t ns) { step_.store(ns, std::memory_order_relaxed); }

 private:
  mutable std::atomic<int64_t> now_;
  std::atomic<int64_t> step_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_CLOCK_H_
