// The engine state of cross-node groups whose job ended here, kept a little
// longer before it is destroyed: the other daemons then learn why the group
// failed from this node's report rather than from a connection reset. Each
// engine key is due `linger_ns` after it was retired (SessionManager: twice
// the cluster heartbeat plus 500 ms); at most `capacity` are kept, and a key
// that finds it full is the caller's to destroy at once.
//
// The time comes from an injected Clock (tests pass a FakeClock).
//
// Thread-safety: not thread-safe. Its owner serializes every call
// (SessionManager holds its mu_; the member is ABSL_GUARDED_BY it there).
#ifndef HSDP_DAEMON_JOBS_RETIRED_GROUPS_H_
#define HSDP_DAEMON_JOBS_RETIRED_GROUPS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "daemon/util/clock.h"

namespace hsdp {

class RetiredGroups {
 public:
  static constexpr size_t kMaxRetiredGroups = 16384;

  // `clock`: null = Clock::Real(); must outlive this.
  RetiredGroups(int64_t linger_ns, const Clock* clock = nullptr,
                size_t capacity = kMaxRetiredGroups);

  // Keeps `engine_key` until linger_ns from now. False (nothing kept) when
  // `capacity` keys are kept already: destroy its state now.
  bool Retire(std::string engine_key);
  // The keys whose time has come, oldest first, no longer kept. The caller
  // destroys their engine state (unless a live group owns it again).
  std::vector<std::string> TakeDue();

  size_t size() const { return keys_.size(); }
  int64_t linger_ns() const { return linger_ns_; }

 private:
  const int64_t linger_ns_;
  const Clock* const clock_;
  const size_t capacity_;
  // Due times never decrease along the queue (one linger, a monotonic clock).
  std::deque<std::pair<std::string, int64_t>> keys_;  // engine key, due (clock ns)
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_RETIRED_GROUPS_H_
