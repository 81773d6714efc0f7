#include "daemon/util/clock.h"

#include <time.h>

namespace hsdp {
namespace {

class MonotonicClock : public Clock {
 public:
  int64_t NowNanos() const override {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const MonotonicClock* const clock = new MonotonicClock();
  return clock;
}

}  // namespace hsdp
