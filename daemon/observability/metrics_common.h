// What the parts of Metrics (node_totals, job_metrics) share when they build
// prometheus-cpp series: the time buckets, the failure reason label, the
// series a completed operation counts in and gauge families made at scrape
// time. Built with prometheus-cpp only.
#ifndef HSDP_DAEMON_OBSERVABILITY_METRICS_COMMON_H_
#define HSDP_DAEMON_OBSERVABILITY_METRICS_COMMON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "daemon/dataplane/group.h"
#include "prometheus/client_metric.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"

namespace hsdp {

// The buckets of every time histogram, 10 us .. 60 s.
const prometheus::Histogram::BucketBoundaries& TimeBuckets();

// The `reason` label of a failure: its status code, "deadline_exceeded".
std::string Reason(const absl::Status& s);

// The series of one label set that a completed operation counts in, the same
// way in the node totals and in a job's series. The registry's families own
// them.
struct OpSeries {
  prometheus::Counter* completed;
  prometheus::Counter* bytes;
  prometheus::Histogram* duration;

  // One more completed operation, its bytes (OpBytes) and its engine time.
  void Count(const GroupSpec& group, const Arrival& a, uint64_t exec_ns) const;
};

// A gauge family of samples made at scrape time, and one of its samples.
prometheus::MetricFamily GaugeFamily(std::string name, std::string help);
prometheus::ClientMetric GaugeValue(double v,
                                    std::vector<prometheus::ClientMetric::Label> labels = {});

// GroupKind's answers, numbered (0 .. 3), for lookup keys.
uint32_t KindIndex(std::string_view kind);

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_METRICS_COMMON_H_
