// Metrics with prometheus-cpp (built when the package is found): the facade
// that wires its parts together.
//   node_totals.*     the node totals and gauges, served without a password
//   job_metrics.*     the per-job series: slot shares, overflow, retirement
//   series_sweeper.*  retires per-job series between scrapes
//   metrics_server.*  /metrics over HTTP, basic auth
//
// Every metric the parts export, by name (tests/integration/check_dashboard.py
// reads the quoted names in this file to check deploy/grafana/hsdpd.json;
// op_observer_test's MetricsCcNamesEveryExportedMetric checks that they are
// exactly what an authenticated scrape serves):
//   node_totals:  "hsdpd_node_ops_completed_total" "hsdpd_node_ops_failed_total"
//                 "hsdpd_node_op_bytes_total" "hsdpd_node_op_duration_seconds"
//                 "hsdpd_engine_busy_seconds_total" "hsdpd_sessions" "hsdpd_jobs"
//                 "hsdpd_groups" "hsdpd_registered_bytes" "hsdpd_registered_bytes_limit"
//                 "hsdpd_node_ops_in_flight" "hsdpd_build_info"
//   job_metrics:  "hsdpd_ops_completed_total" "hsdpd_ops_failed_total"
//                 "hsdpd_op_bytes_total" "hsdpd_op_duration_seconds"
//                 "hsdpd_op_queue_wait_seconds" "hsdpd_op_engine_wait_seconds"
//                 "hsdpd_rank_arrival_lag_seconds" "hsdpd_rank_waited_for_seconds_total"
//                 "hsdpd_rank_last_arrivals_total" "hsdpd_ops_in_flight"
//                 "hsdpd_ring_occupancy_ratio" "hsdpd_arena_ops" "hsdpd_job_priority_level"
#include "daemon/observability/metrics.h"

#include <sstream>
#include <utility>
#include <vector>

#include "daemon/observability/job_metrics.h"
#include "daemon/observability/metrics_server.h"
#include "daemon/observability/node_totals.h"
#include "daemon/observability/series_sweeper.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace hsdp {

class Metrics::Impl {
 public:
  Impl(NodeGaugeSource gauges, MetricsOptions options)
      : options_(std::move(options)),
        // Per-job series only with a password: without one they are not kept.
        jobs_(options_.password.empty()
                  ? nullptr
                  : std::make_unique<JobMetrics>(options_.max_jobs_per_uid,
                                                 [this] { sweeper_.Want(); })),
        node_(std::make_shared<NodeCollectable>(std::move(gauges), jobs_.get())),
        sweeper_([this] { jobs_->Sweep([this] { return node_->Read(); }); }, kSweepInterval),
        server_(options_.username, options_.password) {}

  ~Impl() { StopServing(); }  // stop scrapes and sweeps before anything they read goes

  bool job_series() const { return jobs_ != nullptr; }

  void StopServing() {
    server_.Stop();
    sweeper_.Stop();
  }

  absl::Status Serve(const std::string& listen, std::string* bound) {
    // Collected in this order: node_ first drops what is no longer attached.
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {node_};
    if (job_series()) collectables.push_back(jobs_->registry());
    collectables.push_back(totals_.registry());
    absl::StatusOr<std::string> address = server_.Serve(listen, collectables);
    if (!address.ok()) return address.status();
    *bound = *std::move(address);
    if (job_series()) sweeper_.Start();
    return absl::OkStatus();
  }

  std::string Text() const {
    // node_ first: it drops what is no longer attached.
    std::vector<prometheus::MetricFamily> families = node_->Collect();
    if (job_series()) {
      for (auto& f : jobs_->registry()->Collect()) families.push_back(std::move(f));
    }
    for (auto& f : totals_.registry()->Collect()) families.push_back(std::move(f));
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  MetricsHeld Held() const { return job_series() ? jobs_->Held() : MetricsHeld{}; }

  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
    if (job_series()) jobs_->OnMatched(group, arrivals);
  }

  void OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                   const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
    if (arrivals.empty()) return;
    totals_.OnCompleted(group, arrivals.front(), status, exec_ns);
    if (job_series()) jobs_->OnCompleted(group, arrivals.front(), status, queued_ns, exec_ns);
  }

 private:
  const MetricsOptions options_;
  NodeTotals totals_;
  const std::unique_ptr<JobMetrics> jobs_;  // null without a password
  const std::shared_ptr<NodeCollectable> node_;
  SeriesSweeper sweeper_;
  MetricsServer server_;  // last: destroyed first
};

bool Metrics::Available() { return true; }

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(NodeGaugeSource gauges,
                                                         MetricsOptions options) {
  if (options.max_jobs_per_uid == 0) {
    return absl::InvalidArgumentError("metrics.max_jobs_per_uid: must be at least 1");
  }
  return std::unique_ptr<Metrics>(
      new Metrics(std::make_unique<Impl>(std::move(gauges), std::move(options))));
}

absl::Status Metrics::Serve(const std::string& listen) { return impl_->Serve(listen, &address_); }

void Metrics::StopServing() { impl_->StopServing(); }

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

bool Metrics::job_series() const { return impl_->job_series(); }

std::string Metrics::Text() const { return impl_->Text(); }

MetricsHeld Metrics::Held() const { return impl_->Held(); }

void Metrics::OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
  impl_->OnMatched(group, arrivals);
}

void Metrics::OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                          const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
  impl_->OnCompleted(group, arrivals, status, queued_ns, exec_ns);
}

}  // namespace hsdp
