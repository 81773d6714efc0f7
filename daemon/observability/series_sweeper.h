// SeriesSweeper: a thread that runs `sweep` soon after Want() is called, at
// most once per `min_interval`: Metrics' per-job series are retired this way
// while new ones are being made, so churn without scrapes stays bounded.
//
// Rules: nothing runs before Start() nor after Stop(); one Want() (or many
// within an interval) makes one sweep; a sweep starts at least
// `min_interval` after the previous one began or as soon as it is wanted,
// whichever is later; Stop() does not wait out the interval, only a sweep
// in progress.
//
// Thread-safety: all methods are thread-safe; `sweep` runs on the sweeper's
// thread, never under the sweeper's lock, so it may take locks whose holders
// call Want().
#ifndef HSDP_DAEMON_OBSERVABILITY_SERIES_SWEEPER_H_
#define HSDP_DAEMON_OBSERVABILITY_SERIES_SWEEPER_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hsdp {

class SeriesSweeper {
 public:
  SeriesSweeper(std::function<void()> sweep, absl::Duration min_interval);
  ~SeriesSweeper();  // Stop()
  SeriesSweeper(const SeriesSweeper&) = delete;
  SeriesSweeper& operator=(const SeriesSweeper&) = delete;

  // Starts the thread. Call at most once.
  void Start();
  // Asks for a sweep (before Start: the first one after it).
  void Want() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the thread, after the sweep in progress. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  bool WantedOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wanted_ || stop_; }

  const std::function<void()> sweep_;
  const absl::Duration min_interval_;
  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_SERIES_SWEEPER_H_
