// The coordinator's key/value store for rendezvous (Gloo addresses, NCCL
// unique ids): Set, Get, Add (an atomic counter), Wait (for keys, with a
// deadline) and Barrier. Bounded: key count, key and value sizes, total
// bytes and pending waiters are limited, and anything beyond a limit is
// RESOURCE_EXHAUSTED, so a flood cannot exhaust the coordinator.
//
// Thread-safe. Wait and Barrier never block the caller: they take a
// completion callback that runs exactly once — at once (on the caller's
// thread) when the result is already known, else on the thread that
// completes the wait (a Set/Add/Barrier caller) or on the store's timer
// thread (deadline, shutdown). Callbacks run without the store's lock held.
#ifndef HSDP_DAEMON_CLUSTER_KV_STORE_H_
#define HSDP_DAEMON_CLUSTER_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/kv_limits.h"

namespace hsdp {

class KvStore {
 public:
  using Done = std::function<void(absl::Status)>;

  explicit KvStore(KvLimits limits = {});
  ~KvStore();  // Shutdown()
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // INVALID_ARGUMENT for an empty or oversized key, RESOURCE_EXHAUSTED when
  // the value or the store would exceed its limits.
  absl::Status Set(const std::string& key, std::string value) ABSL_LOCKS_EXCLUDED(mu_);
  // Stores `value` only when `key` is absent; returns the value stored now
  // (`value`, or the one that was there first). Errors as Set.
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key, std::string value)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the keys that exist; INVALID_ARGUMENT for a bad key (nothing removed).
  absl::Status Delete(const std::vector<std::string>& keys) ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND when absent.
  absl::StatusOr<std::string> Get(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `delta` to the decimal integer at `key` (absent = 0) and returns the
  // sum; INVALID_ARGUMENT when the value is not an integer or would overflow.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) ABSL_LOCKS_EXCLUDED(mu_);
  // `done(OK)` once every key exists; DEADLINE_EXCEEDED at `deadline`
  // (capped at limits.max_wait), UNAVAILABLE on shutdown.
  void Wait(const std::vector<std::string>& keys, absl::Time deadline, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `done(OK)` for all once `count` callers wait on `name`; the barrier then
  // resets. INVALID_ARGUMENT when `count` disagrees with the callers already
  // waiting; a caller whose deadline passes leaves the barrier.
  void Barrier(const std::string& name, uint32_t count, absl::Time deadline, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Completes every pending call with UNAVAILABLE and stops the timer.
  // Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  size_t key_count() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t waiter_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter {
    uint64_t id;
    std::vector<std::string> keys;  // Wait: keys still missing at the start
    std::string barrier;            // Barrier: its name ("" for Wait)
    absl::Time deadline;
    Done done;
  };
  struct BarrierState {
    uint32_t count = 0;
    std::vector<uint64_t> waiting;  // waiter ids
  };
  using Completion = std::pair<Done, absl::Status>;

  absl::Status CheckKey(const std::string& key) const;
  absl::Status Store(const std::string& key, std::string value, std::vector<Completion>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time CapDeadline(absl::Time deadline) const;
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  static void Run(std::vector<Completion>& completions);

  const KvLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_KV_STORE_H_
