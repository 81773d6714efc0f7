// Observability: the daemon's real OpObserver. It fans every operation
// event out to the Prometheus metrics (when metrics.listen is set), the
// trace ring (while a trace records) and the straggler stats, and keeps
// per-job activity counters for `hsdpctl top`. Owned by the Daemon; groups
// hold a raw pointer (GroupSpec::observer) and the Daemon outlives them.
//
// Thread-safety: all methods are thread-safe. Lock order: a Group's lock
// before any lock in here; nothing in here calls out while holding a lock
// (except Metrics' scrape, which reads the NodeGaugeSource first).
#ifndef HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_H_
#define HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/observability/metrics.h"
#include "daemon/dataplane/op_observer.h"
#include "daemon/observability/straggler_stats.h"
#include "daemon/observability/trace_ring.h"

namespace hsdp {

struct ObservabilityOptions {
  explicit ObservabilityOptions(std::string listen = "", size_t trace = 65536)
      : metrics_listen(std::move(listen)), trace_events(trace) {}

  std::string metrics_listen;   // "HOST:PORT"; "" = no metrics endpoint
  size_t trace_events = 65536;  // trace ring capacity; 0 = no tracing
  // metrics.password_file: "" = /metrics without authentication, node
  // totals only; else read (ReadMetricsPassword) by Create.
  std::string metrics_password_file;
  std::string metrics_username = "hsdpd";
  uint32_t metrics_max_jobs_per_uid = 32;
};

// Totals of one job since it first ran an operation on this node.
struct JobActivity {
  std::string job_id;
  uint32_t uid = 0;  // the job's owner
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t bytes = 0;    // per-rank buffer bytes of completed ops (see OpBytes)
  uint64_t busy_ns = 0;  // engine time
  // Time its operations waited inside the engine (handed off, not running:
  // behind other work, or between the slices of a large one), completed ones.
  uint64_t engine_wait_ns = 0;
};

class Observability final : public OpObserver {
 public:
  // With options.metrics_listen set, creates the metrics (UNIMPLEMENTED
  // when built without prometheus-cpp; the password file's refusal naming
  // metrics.password_file); they are served by ServeMetrics.
  // `gauges` is called at scrapes only.
  static absl::StatusOr<std::unique_ptr<Observability>> Create(const ObservabilityOptions& options,
                                                               NodeGaugeSource gauges);
  // Starts the /metrics endpoint (a no-op when metrics are off): call once
  // everything `gauges` reads exists. UNAVAILABLE when it cannot bind.
  absl::Status ServeMetrics();
  // Stops it; call before what `gauges` reads goes away. Idempotent.
  void StopMetrics();
  // "HOST:PORT" serving /metrics ("" when off).
  std::string metrics_address() const;

  // OpObserver.
  void OnArrival(const GroupSpec& group, const Arrival& arrival) override;
  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) override;
  void OnLaunched(const GroupSpec& group, const Arrival& any, uint64_t ticket) override;
  void OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                   const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) override;

  // Null when metrics are off.
  const Metrics* metrics() const { return metrics_.get(); }
  TraceRing& trace() { return trace_; }
  const StragglerStats& stragglers() const { return stragglers_; }
  // Jobs of `only_uid` (every job if unset).
  std::vector<JobActivity> Activity(std::optional<uint32_t> only_uid) const;

  static constexpr size_t kMaxJobs = 1024;

 private:
  Observability(const ObservabilityOptions& options, std::unique_ptr<Metrics> metrics);

  const std::string metrics_listen_;
  std::unique_ptr<Metrics> metrics_;
  TraceRing trace_;
  StragglerStats stragglers_;

  mutable absl::Mutex mu_;
  std::map<JobKey, JobActivity> jobs_ ABSL_GUARDED_BY(mu_);  // per (owner, name)
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_H_
