// Metrics: hsdpd's Prometheus metrics (prometheus-cpp), served over HTTP at
// /metrics when `metrics.listen` is set. Per-operation series are updated
// from the OpObserver hooks; node-level gauges are read from a
// NodeGaugeSource at scrape time (nothing on the data plane).
//
// Series (all names start with hsdpd_; labels are low-cardinality: job_id
// and owner_uid (a job is its owner plus its id), group kind, op, dtype,
// reason; rank only per job, bounded by the world size on this node; never
// op ids or sequence numbers). The job label is `job_id`, not `job`:
// Prometheus owns `job` (the scrape job) and would rename ours to
// `exported_job`. "job" below stands for job_id,owner_uid.
//   hsdpd_ops_completed_total{job,group,op,dtype}     counter
//   hsdpd_ops_failed_total{job,group,op,dtype,reason} counter (reason: status code)
//   hsdpd_op_bytes_total{job,group,op,dtype}          counter (per-rank buffer size)
//   hsdpd_op_duration_seconds{job,group,op,dtype}     histogram (engine time)
//   hsdpd_op_queue_wait_seconds{job,group,op,dtype}   histogram (first arrival -> engine)
//   hsdpd_op_engine_wait_seconds{job,group,op,dtype}  histogram (handed off, not running)
//   hsdpd_rank_arrival_lag_seconds{job,rank}          histogram (arrival - first arrival)
//   hsdpd_rank_waited_for_seconds_total{job,rank}     counter (others waited for it, last)
//   hsdpd_rank_last_arrivals_total{job,rank}          counter
//   hsdpd_engine_busy_seconds_total                   counter
//   hsdpd_sessions, hsdpd_jobs, hsdpd_groups, hsdpd_registered_bytes,
//   hsdpd_registered_bytes_limit                      gauges
//   hsdpd_ops_in_flight{job}, hsdpd_ring_occupancy_ratio{job} gauges
//   hsdpd_build_info{version}                         gauge (1)
// A job's series are dropped kJobRetention after it left the node.
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
  };
  uint64_t sessions = 0;
  uint64_t groups = 0;
  uint64_t registered_bytes = 0;
  uint64_t registered_bytes_limit = 0;
  std::vector<Job> jobs;  // every job attached now
};
using NodeGaugeSource = std::function<NodeGauges()>;

class Metrics {
 public:
  static constexpr absl::Duration kJobRetention = absl::Minutes(5);

  // True when hsdpd was built with prometheus-cpp.
  static bool Available();
  // Metrics with no HTTP endpoint yet (Text() renders them). `gauges` is
  // called at every scrape, never before Serve or Text. UNIMPLEMENTED when
  // built without prometheus-cpp.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(NodeGaugeSource gauges);
  ~Metrics();

  // Serves /metrics on `listen` ("HOST:PORT"; port 0 picks a free one).
  // UNAVAILABLE when the address cannot be bound. Call once.
  absl::Status Serve(const std::string& listen);
  // Stops serving (waits for scrapes in progress). Idempotent.
  void StopServing();

  // "HOST:PORT" actually bound ("" without HTTP).
  const std::string& address() const { return address_; }
  // The exposition text (what /metrics returns).
  std::string Text() const;

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

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_METRICS_H_
