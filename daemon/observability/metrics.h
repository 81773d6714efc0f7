// Metrics: hsdpd's Prometheus metrics (prometheus-cpp), served over HTTP at
// /metrics when `metrics.listen` is set. Per-operation series are updated
// from the OpObserver hooks; node-level gauges are read from a
// NodeGaugeSource at scrape time (nothing on the data plane).
//
// Two views. Without a password (metrics.password_file unset) /metrics
// serves node totals only: no series names a job, an owner or a rank, and
// none are kept, so whoever reaches the port learns no other user's job
// names. With a password /metrics asks for HTTP basic auth and serves the
// per-job series too.
//
// Node totals (both views; labels: group kind, op, dtype, reason):
//   hsdpd_node_ops_completed_total{group,op,dtype}    counter
//   hsdpd_node_ops_failed_total{op,reason}            counter
//   hsdpd_node_op_bytes_total{group,op,dtype}         counter
//   hsdpd_node_op_duration_seconds{op}                histogram (engine time)
//   hsdpd_engine_busy_seconds_total                   counter
//   hsdpd_sessions, hsdpd_jobs, hsdpd_groups, hsdpd_registered_bytes,
//   hsdpd_registered_bytes_limit, hsdpd_node_ops_in_flight gauges
//   hsdpd_build_info{version}                         gauge (1)
// Per job (authenticated view only; "job" stands for job_id,owner_uid: a
// job is its owner plus its id. The label is `job_id`, not `job`, which
// Prometheus owns for the scrape job):
//   hsdpd_ops_completed_total{job,group,op,dtype}     counter
//   hsdpd_ops_failed_total{job,group,op,dtype,reason} counter (reason: status code)
//   hsdpd_op_bytes_total{job,group,op,dtype}          counter (per-rank buffer size)
//   hsdpd_op_duration_seconds{job,group,op,dtype}     histogram (engine time)
//   hsdpd_op_queue_wait_seconds{job,group,op,dtype}   histogram (first arrival -> engine)
//   hsdpd_op_engine_wait_seconds{job,group,op,dtype}  histogram (handed off, not running)
//   hsdpd_rank_arrival_lag_seconds{job,rank}          histogram (arrival - first arrival)
//   hsdpd_rank_waited_for_seconds_total{job,rank}     counter (others waited for it, last)
//   hsdpd_rank_last_arrivals_total{job,rank}          counter
//   hsdpd_ops_in_flight{job}, hsdpd_ring_occupancy_ratio{job}, hsdpd_arena_ops{job},
//   hsdpd_job_priority_level{job,priority_class}      gauges
//
// Bounded by what is attached: a job's series go once it has no session on
// the node, a rank's once no session of that rank is attached (checked at
// every scrape and, while series are being created, by a sweeper thread at
// most every kSweepInterval, so churn without scrapes is bounded too). At
// most kMaxJobs jobs have series of their own and one owner uid at most
// max_jobs_per_uid of them; an owner's further jobs share its own overflow
// series (job_id "_other", owner_uid its uid), never another owner's. A job
// keeps at most kMaxRanksPerJob rank series, later ranks share rank "_other".
//
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_OBSERVABILITY_METRICS_H_
#define HSDP_DAEMON_OBSERVABILITY_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/dataplane/group.h"

namespace hsdp {

// Node-level values, read at scrape time.
struct NodeGauges {
  struct Job {
    std::string job_id;
    uint64_t ops_in_flight = 0;  // submitted, not yet completed (all its sessions)
    double ring_occupancy = 0;   // max over its sessions of in-flight / ring slots
    uint32_t owner_uid = 0;      // the job's owner (a job is its owner plus its id)
    std::string priority_class;  // its class of service (jobs.priority_classes), "" if unknown
    uint32_t priority_level = 0;
    // Operations its live groups completed in their small-operation arenas
    // (the daemon sees none of them: docs/architecture.md).
    uint64_t arena_ops = 0;
    std::vector<int> ranks;  // the ranks of its attached sessions
  };
  uint64_t sessions = 0;
  uint64_t groups = 0;
  uint64_t registered_bytes = 0;
  uint64_t registered_bytes_limit = 0;
  std::vector<Job> jobs;  // every job attached now
  std::vector<uint32_t> group_ids;  // every group now
};
using NodeGaugeSource = std::function<NodeGauges()>;

struct MetricsOptions {
  // HTTP basic auth on /metrics; password "" = none, and then only node
  // totals are kept and served.
  std::string username = "hsdpd";
  std::string password;
  // Jobs of one owner uid that get series of their own (of kMaxJobs).
  uint32_t max_jobs_per_uid = 32;
};

// What the per-job series hold now (tests; the next scrape shows at most this).
struct MetricsHeld {
  size_t jobs = 0;       // jobs with series of their own
  size_t overflows = 0;  // owners' "_other" series sets
  size_t ranks = 0;      // rank series sets, over all jobs
  size_t cached = 0;     // per-group lookup entries
};

class Metrics {
 public:
  static constexpr size_t kMaxJobs = 256;
  static constexpr size_t kMaxRanksPerJob = 1024;
  static constexpr absl::Duration kSweepInterval = absl::Milliseconds(250);

  // True when hsdpd was built with prometheus-cpp.
  static bool Available();
  // Metrics with no HTTP endpoint yet (Text() renders them). `gauges` is
  // called at every scrape and sweep, never before Serve or Text.
  // UNIMPLEMENTED when built without prometheus-cpp.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(NodeGaugeSource gauges,
                                                         MetricsOptions options = {});
  ~Metrics();

  // Serves /metrics on `listen` ("HOST:PORT"; port 0 picks a free one), with
  // basic auth when a password is set, and starts the sweeper. UNAVAILABLE
  // when the address cannot be bound. Call once.
  absl::Status Serve(const std::string& listen);
  // Stops serving (waits for scrapes in progress) and the sweeper. Idempotent.
  void StopServing();

  // "HOST:PORT" actually bound ("" without HTTP).
  const std::string& address() const { return address_; }
  // Whether per-job series are kept (a password is set).
  bool job_series() const;
  // The exposition text an authorised scrape of /metrics returns (it first
  // drops the series of what is no longer attached).
  std::string Text() const;
  MetricsHeld Held() const;

  // Observer hooks (see OpObserver).
  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals);
  void OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                   const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns);

  class Impl;

 private:
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// The password of metrics.password_file at `path`: the file's contents
// without surrounding whitespace. Refused (naming the key, the path and the
// reason) unless it is a regular file owned by root or this process's
// effective uid, not readable or writable by group or others, of at most
// 4096 bytes, holding at least 16 characters.
absl::StatusOr<std::string> ReadMetricsPassword(const std::string& path);

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_METRICS_H_
