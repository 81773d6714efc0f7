#include "daemon/observability/node_totals.h"

#include <string>
#include <utility>

#include "daemon/observability/metrics_common.h"
#include "daemon/observability/op_labels.h"
#include "hsdp/common/version.h"

namespace hsdp {

NodeTotals::NodeTotals()
    : registry_(std::make_shared<prometheus::Registry>()),
      completed_(prometheus::BuildCounter()
                     .Name("hsdpd_node_ops_completed_total")
                     .Help("Operations of all jobs that completed successfully")
                     .Register(*registry_)),
      failed_(prometheus::BuildCounter()
                  .Name("hsdpd_node_ops_failed_total")
                  .Help("Operations of all jobs (or refused submissions) that failed, by "
                        "status code")
                  .Register(*registry_)),
      bytes_(prometheus::BuildCounter()
                 .Name("hsdpd_node_op_bytes_total")
                 .Help("Per-rank buffer bytes of all jobs' completed operations")
                 .Register(*registry_)),
      duration_(prometheus::BuildHistogram()
                    .Name("hsdpd_node_op_duration_seconds")
                    .Help("Engine time of all jobs' completed operations")
                    .Register(*registry_)),
      busy_(prometheus::BuildCounter()
                .Name("hsdpd_engine_busy_seconds_total")
                .Help("Sum of the engine time of all operations")
                .Register(*registry_)
                .Add({})) {}

void NodeTotals::OnCompleted(const GroupSpec& group, const Arrival& a, const absl::Status& status,
                             uint64_t exec_ns) {
  if (exec_ns > 0) busy_.Increment(exec_ns / 1e9);
  if (!status.ok()) {
    failed_.Add({{"op", std::string(OpName(a))}, {"reason", Reason(status)}}).Increment();
    return;
  }
  absl::MutexLock l(&mu_);
  SeriesFor(group, a).Count(group, a, exec_ns);
}

OpSeries& NodeTotals::SeriesFor(const GroupSpec& group, const Arrival& a) {
  const std::string_view kind = GroupKind(group, a);
  const uint32_t key = (uint32_t{a.desc.collective} << 16) | (uint32_t{a.desc.dtype} << 8) |
                       KindIndex(kind);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const prometheus::Labels labels = {{"group", std::string(kind)},
                                     {"op", std::string(OpName(a))},
                                     {"dtype", std::string(DtypeName(a))}};
  OpSeries s{&completed_.Add(labels), &bytes_.Add(labels),
             &duration_.Add({{"op", std::string(OpName(a))}}, TimeBuckets())};
  return cache_.emplace(key, s).first->second;
}

NodeCollectable::NodeCollectable(NodeGaugeSource source, JobScrape* jobs)
    : source_(std::move(source)), jobs_(jobs) {}

NodeGauges NodeCollectable::Read() const { return source_ ? source_() : NodeGauges{}; }

std::vector<prometheus::MetricFamily> NodeCollectable::Collect() const {
  // The generation starts before the read: what attaches after it uses its
  // series in this generation, so Retire keeps them.
  const uint64_t generation = jobs_ != nullptr ? jobs_->NextGeneration() : 0;
  const NodeGauges g = Read();
  if (jobs_ != nullptr) jobs_->Retire(g, generation);
  std::vector<prometheus::MetricFamily> out;
  auto single = [&](const char* name, const char* help, double v) {
    prometheus::MetricFamily f = GaugeFamily(name, help);
    f.metric.push_back(GaugeValue(v));
    out.push_back(std::move(f));
  };
  single("hsdpd_sessions", "Attached sessions", g.sessions);
  single("hsdpd_jobs", "Jobs with attached sessions", g.jobs.size());
  single("hsdpd_groups", "Communication groups", g.groups);
  single("hsdpd_registered_bytes", "Shared memory registered by all sessions",
         g.registered_bytes);
  single("hsdpd_registered_bytes_limit", "limits.max_node_bytes (resolved)",
         g.registered_bytes_limit);
  uint64_t in_flight_total = 0;
  for (const NodeGauges::Job& j : g.jobs) in_flight_total += j.ops_in_flight;
  single("hsdpd_node_ops_in_flight", "Operations of all jobs submitted and not yet completed",
         in_flight_total);
  if (jobs_ != nullptr) jobs_->JobGauges(g, &out);
  prometheus::MetricFamily info = GaugeFamily("hsdpd_build_info", "hsdpd's version");
  info.metric.push_back(GaugeValue(1, {{"version", kHsdpVersion}}));
  out.push_back(std::move(info));
  return out;
}

}  // namespace hsdp
