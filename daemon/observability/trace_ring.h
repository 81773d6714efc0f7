// TraceRing: a bounded flight recorder of operation events for
// `hsdpctl trace`. Fixed capacity (the oldest events are overwritten), and
// it records only while armed: Arm() turns recording on for a while (the
// Trace RPC does it), after which it switches itself off. When it is off,
// the cost for the data plane is one relaxed atomic load (Recording's fast
// path); the timestamps come with the events.
//
// Thread-safety: all methods are thread-safe; writers take mu_ briefly.
#ifndef HSDP_DAEMON_OBSERVABILITY_TRACE_RING_H_
#define HSDP_DAEMON_OBSERVABILITY_TRACE_RING_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace hsdp {

enum class TraceEventKind : uint8_t {
  kArrival = 1,    // per member: its submission reached the group
  kMatched = 2,    // per op: every local member arrived and agreed
  kLaunched = 3,   // per op: the engine ordered it
  kCompleted = 4,  // per member: the outcome was sent
};

struct TraceEvent {
  int64_t ts_ns = 0;        // monotonic (shm::NowNanos)
  uint64_t session_id = 0;  // arrival, completed: the member; matched: the last to arrive
  uint64_t op_id = 0;       // the member's op id (arrival, completed)
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t ticket = 0;   // launched: the engine's ticket
  int64_t value_ns = 0;  // matched: how long the others waited for the last member;
                         // completed: engine time
  uint32_t group_id = 0;
  uint32_t epoch = 0;
  int32_t rank = -1;        // global rank of session_id
  int32_t status_code = 0;  // completed: absl::StatusCode
  TraceEventKind kind = TraceEventKind::kArrival;
  uint8_t collective = 0;
  uint8_t dtype = 0;
  bool phase2 = false;
};

// Who a group belongs to (for track names and for filtering by caller).
struct TraceGroupInfo {
  std::string job_id;
  uint32_t uid = 0;
  int size = 0;
};

struct TraceSnapshot {
  std::vector<TraceEvent> events;  // in recording order
  std::map<uint32_t, TraceGroupInfo> groups;
  uint64_t overwritten = 0;  // events lost to the capacity since start
};

class TraceRing {
 public:
  // `capacity` events (0: tracing is unavailable). Memory is allocated on
  // the first Arm.
  explicit TraceRing(size_t capacity);

  size_t capacity() const { return capacity_; }

  // Records until max(current end, now_ns + duration_ns). False (and
  // nothing armed) when capacity is 0.
  bool Arm(int64_t now_ns, int64_t duration_ns);
  // End of the current recording (0: off).
  int64_t armed_until_ns() const { return armed_until_ns_.load(std::memory_order_relaxed); }

  // Whether events at `now_ns` are recorded. Inline fast path when off.
  bool Recording(int64_t now_ns) {
    const int64_t until = armed_until_ns_.load(std::memory_order_relaxed);
    return until != 0 && (now_ns < until || Expire(until));
  }
  bool MaybeRecording() const { return armed_until_ns_.load(std::memory_order_relaxed) != 0; }

  // Appends events (overwriting the oldest). Callers check Recording first.
  void Append(std::span<const TraceEvent> events) ABSL_LOCKS_EXCLUDED(mu_);
  // Append, and remember (once, bounded) who owns group `group_id`: job
  // `job_id` of `uid`, `size` ranks. One lock; copies nothing when known.
  void AppendForGroup(std::span<const TraceEvent> events, uint32_t group_id,
                      const std::string& job_id, uint32_t uid, int size) ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers who owns `group_id` (idempotent, bounded).
  void NoteGroup(uint32_t group_id, const TraceGroupInfo& info) ABSL_LOCKS_EXCLUDED(mu_);

  // Events with from_ns <= ts_ns <= to_ns, oldest first, of groups owned by
  // `only_uid` (< 0: everyone) and of job `job_id` ("" = any).
  TraceSnapshot Window(int64_t from_ns, int64_t to_ns, int64_t only_uid,
                       const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Turns recording off when `until` passed; always false.
  bool Expire(int64_t until);
  void NoteGroupLocked(uint32_t group_id, const TraceGroupInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr size_t kMaxGroups = 65536;

  const size_t capacity_;
  std::atomic<int64_t> armed_until_ns_{0};
  mutable absl::Mutex mu_;
  std::vector<TraceEvent> ring_ ABSL_GUARDED_BY(mu_);  // capacity_ once armed
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;          // events ever appended
  std::map<uint32_t, TraceGroupInfo> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_TRACE_RING_H_
