// How both memberships join at start: attempts until cluster.join_timeout_ms,
// a pause between attempts that grows (from 200 ms up to a cap) with jitter,
// so that a crowd of nodes that cannot reach its store does not retry in
// lockstep; an error that retrying cannot fix (PermanentJoinError) ends it
// at once; Cancel ends it (CANCELLED) within one attempt. When time runs
// out, DEADLINE_EXCEEDED names the store and the last error.
//
// Thread-safe: Run on one thread, Cancel from any.
#ifndef HSDP_DAEMON_CLUSTER_JOIN_RETRY_H_
#define HSDP_DAEMON_CLUSTER_JOIN_RETRY_H_

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hsdp {

class JoinRetry {
 public:
  struct Options {
    // What the messages name: "the coordinator HOST:PORT", "etcd (...)".
    std::string store;
    // Put after "cannot join the cluster" in a permanent error: "" or
    // " in etcd (...)".
    std::string where;
    // Appended to a PERMISSION_DENIED error (what access the node needs).
    std::string permission_hint;
    absl::Duration join_timeout = absl::Seconds(60);
    // The longest one attempt may take: short, so that Cancel (SIGTERM)
    // ends a join soon.
    absl::Duration attempt = absl::Seconds(1);
    // The cap of the pause between attempts.
    absl::Duration max_backoff = absl::Milliseconds(200);
  };
  // One join attempt within `timeout`.
  using Attempt = std::function<absl::Status(absl::Duration timeout)>;

  explicit JoinRetry(Options options) : options_(std::move(options)) {}

  // Runs attempts until one succeeds (OK), one fails for good (its code,
  // "cannot join the cluster<where>: ..."), Cancel (CANCELLED) or the
  // deadline (DEADLINE_EXCEEDED). Blocks.
  absl::Status Run(const Attempt& attempt) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a Run in progress, and every later one. Idempotent.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  // The error of the last attempt that failed (what MemberStatus shows).
  absl::Status last() const ABSL_LOCKS_EXCLUDED(mu_);

  // The pause after failed attempt number `attempt` (0-based), for a
  // uniform `u` in [0, 1): min(200 ms × 2^attempt, cap) × (0.5 + u / 2).
  static absl::Duration Backoff(int attempt, absl::Duration cap, double u);

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_JOIN_RETRY_H_
