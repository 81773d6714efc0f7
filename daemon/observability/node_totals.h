// The node-totals view of Metrics: what /metrics serves to anyone, with or
// without a password. No series here names a job, an owner or a rank.
//
// NodeTotals: the operation series summed over all jobs
// (hsdpd_node_ops_completed_total, hsdpd_node_ops_failed_total,
// hsdpd_node_op_bytes_total, hsdpd_node_op_duration_seconds,
// hsdpd_engine_busy_seconds_total), updated at completion.
//
// NodeCollectable: the gauges read from the NodeGaugeSource at scrape time
// (hsdpd_sessions ... hsdpd_node_ops_in_flight, hsdpd_build_info). When the
// per-job series are kept (a password is set) it is also where a scrape
// retires the series of what is no longer attached and adds the per-job
// gauges, through JobScrape; it is collected first for that reason.
//
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_OBSERVABILITY_NODE_TOTALS_H_
#define HSDP_DAEMON_OBSERVABILITY_NODE_TOTALS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/dataplane/group.h"
#include "daemon/observability/metrics.h"
#include "daemon/observability/metrics_common.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace hsdp {

class NodeTotals {
 public:
  NodeTotals();
  NodeTotals(const NodeTotals&) = delete;
  NodeTotals& operator=(const NodeTotals&) = delete;

  // One operation's outcome (`a`: any of its arrivals; `exec_ns`: engine time).
  void OnCompleted(const GroupSpec& group, const Arrival& a, const absl::Status& status,
                   uint64_t exec_ns);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  OpSeries& SeriesFor(const GroupSpec& group, const Arrival& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& failed_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Counter& busy_;

  absl::Mutex mu_;
  // By (op, dtype, group kind): a handful of entries, never dropped.
  absl::flat_hash_map<uint32_t, OpSeries> cache_ ABSL_GUARDED_BY(mu_);
};

// The per-job series' part in a scrape (JobMetrics implements it).
class JobScrape {
 public:
  virtual ~JobScrape() = default;
  // Starts a sweep generation, before the gauges are read.
  virtual uint64_t NextGeneration() = 0;
  // Drops the series of what `g` no longer holds and was not used since
  // `generation` began.
  virtual void Retire(const NodeGauges& g, uint64_t generation) = 0;
  // Appends the per-job gauges of `g`.
  virtual void JobGauges(const NodeGauges& g, std::vector<prometheus::MetricFamily>* out) = 0;
};

class NodeCollectable : public prometheus::Collectable {
 public:
  // `jobs`: the per-job series, or null when only node totals are kept; it
  // must outlive this.
  NodeCollectable(NodeGaugeSource source, JobScrape* jobs);

  // The node gauges (and, with `jobs`, the per-job ones), after retiring
  // what is no longer attached.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The source's values (empty without a source).
  NodeGauges Read() const;

 private:
  const NodeGaugeSource source_;
  JobScrape* const jobs_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_NODE_TOTALS_H_
