// SeriesSweeper's rules (daemon/observability/series_sweeper.h): nothing
// runs before Start or after Stop, wants coalesce into one sweep, and Stop
// does not wait out the interval. No sleeps: every wait is on a condition.
#include "daemon/observability/series_sweeper.h"

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

// Counts sweeps; a sweep can be held until released.
class Sweeps {
 public:
  void Run() {
    absl::MutexLock l(&mu_);
    ++started_;
    mu_.Await(absl::Condition(&released_));
    ++done_;
  }
  void WaitDone(int n) {
    absl::MutexLock l(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  void WaitStarted(int n) {
    absl::MutexLock l(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return started_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  void Release(bool released) {
    absl::MutexLock l(&mu_);
    released_ = released;
  }
  int done() {
    absl::MutexLock l(&mu_);
    return done_;
  }
  int started() {
    absl::MutexLock l(&mu_);
    return started_;
  }

 private:
  absl::Mutex mu_;
  int started_ = 0, done_ = 0;
  bool released_ = true;
};

TEST(SeriesSweeperTest, NothingRunsBeforeStart) {
  Sweeps sweeps;
  {
    SeriesSweeper sweeper([&] { sweeps.Run(); }, absl::ZeroDuration());
    sweeper.Want();
  }  // destroyed without Start
  EXPECT_EQ(sweeps.started(), 0);
}

TEST(SeriesSweeperTest, AWantBeforeStartSweepsOnceStarted) {
  Sweeps sweeps;
  SeriesSweeper sweeper([&] { sweeps.Run(); }, absl::ZeroDuration());
  sweeper.Want();
  sweeper.Start();
  sweeps.WaitDone(1);
  sweeper.Stop();
  EXPECT_EQ(sweeps.done(), 1);
}

TEST(SeriesSweeperTest, WantsWithinAnIntervalMakeOneSweep) {
  Sweeps sweeps;
  // An interval no test waits out: only Stop ends it.
  SeriesSweeper sweeper([&] { sweeps.Run(); }, absl::Hours(1));
  sweeper.Start();
  sweeper.Want();
  sweeps.WaitDone(1);
  for (int i = 0; i < 100; ++i) sweeper.Want();
  // Stop ends the interval's wait at once, and the wanted sweep never runs.
  sweeper.Stop();
  EXPECT_EQ(sweeps.started(), 1);
}

TEST(SeriesSweeperTest, AWantDuringASweepMakesAnotherAfterTheInterval) {
  Sweeps sweeps;
  SeriesSweeper sweeper([&] { sweeps.Run(); }, absl::ZeroDuration());
  sweeps.Release(false);
  sweeper.Start();
  sweeper.Want();
  sweeps.WaitStarted(1);
  sweeper.Want();  // while the first runs
  sweeps.Release(true);
  sweeps.WaitDone(2);
  sweeper.Stop();
  EXPECT_EQ(sweeps.done(), 2);
}

TEST(SeriesSweeperTest, StopWaitsForTheSweepInProgress) {
  Sweeps sweeps;
  SeriesSweeper sweeper([&] { sweeps.Run(); }, absl::ZeroDuration());
  sweeps.Release(false);
  sweeper.Start();
  sweeper.Want();
  sweeps.WaitStarted(1);
  std::thread stopper([&] { sweeper.Stop(); });
  // The sweep cannot finish before it is released; Stop returns after it.
  EXPECT_EQ(sweeps.done(), 0);
  sweeps.Release(true);
  stopper.join();
  EXPECT_EQ(sweeps.done(), 1);
  sweeper.Stop();  // idempotent
}

}  // namespace
}  // namespace hsdp
