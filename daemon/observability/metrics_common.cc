#include "daemon/observability/metrics_common.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "daemon/observability/op_labels.h"

namespace hsdp {

const prometheus::Histogram::BucketBoundaries& TimeBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
      0.05, 0.1,    0.25, 0.5,  1,      2.5,  5,    10,     30,   60};
  return kBuckets;
}

std::string Reason(const absl::Status& s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

void OpSeries::Count(const GroupSpec& group, const Arrival& a, uint64_t exec_ns) const {
  completed->Increment();
  bytes->Increment(static_cast<double>(OpBytes(group, a)));
  duration->Observe(exec_ns / 1e9);
}

prometheus::ClientMetric GaugeValue(double v,
                                    std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  return m;
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

uint32_t KindIndex(std::string_view kind) {
  if (kind == "world") return 0;
  if (kind == "sub") return 1;
  if (kind == "shard") return 2;
  return 3;
}

}  // namespace hsdp
