// Prometheus metrics of a real hsdpd: /metrics scraped directly and parsed
// (series, values that match the workload exactly, gauges while sessions
// are attached), a port that cannot be bound, and — where the `prometheus`
// binary is installed — a real Prometheus server scraping the daemon, with
// the counters checked through its HTTP query API.
#include <unistd.h>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "hsdp/common/version.h"
#include "observability_util.h"

namespace hsdp {
namespace {

using testing::Child;
using testing::DaemonProcess;
using testing::Eventually;
using ::testing::HasSubstr;
using testing::HttpGet;
using testing::NowMs;
using testing::ParsePromText;
using testing::PortOf;
using testing::QueryStatus;
using testing::TempDir;
using testing::Workload;

const std::string kMetricsConfig =
    std::string(testing::kDaemonPathOnly) + "metrics:\n  listen: \"127.0.0.1:0\"\n";

// The daemon's metrics port, from `hsdpctl --json status`.
int MetricsPort(const DaemonProcess& d) {
  v1::StatusResponse st;
  if (!QueryStatus(d.socket(), &st)) return 0;
  return PortOf(st.metrics_address());
}

std::map<std::string, double> Scrape(int port) {
  int status = 0;
  const std::string text = HttpGet(port, "/metrics", &status);
  EXPECT_EQ(status, 200);
  std::map<std::string, double> series;
  std::string bad;
  EXPECT_TRUE(ParsePromText(text, &series, &bad)) << "unparsable line: " << bad;
  return series;
}

// The owner_uid label: the workload's trainers run as this test's uid.
std::string Owner() { return std::to_string(::geteuid()); }

std::string OpSeries(const char* name, const std::string& job, const char* op,
                     const char* dtype = "float32") {
  return std::string(name) + "{dtype=\"" + dtype + "\",group=\"world\",job_id=\"" + job +
         "\",op=\"" + op + "\",owner_uid=\"" + Owner() + "\"}";
}

TEST(ObservabilityMetricsTest, ScrapeMatchesTheWorkloadExactly) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(kMetricsConfig)) << d.Log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("/metrics on http://127.0.0.1:" + std::to_string(port)));

  Workload w;
  w.socket = d.socket();
  w.job = "metrics-job";
  w.all_reduces = 20;
  w.all_gathers = 5;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;

  // While both sessions are attached.
  std::map<std::string, double> m = Scrape(port);
  EXPECT_EQ(m["hsdpd_sessions"], 2);
  EXPECT_EQ(m["hsdpd_jobs"], 1);
  EXPECT_EQ(m["hsdpd_groups"], 1);
  EXPECT_GT(m["hsdpd_registered_bytes"], 0);
  EXPECT_EQ(m["hsdpd_ops_in_flight{job_id=\"metrics-job\",owner_uid=\"" + Owner() + "\"}"], 0);
  // No jobs.priority_classes: the job is in the built-in class "default", level 4.
  EXPECT_EQ(m["hsdpd_job_priority_level{job_id=\"metrics-job\",owner_uid=\"" + Owner() +
              "\",priority_class=\"default\"}"],
            4);
  EXPECT_EQ(m[OpSeries("hsdpd_ops_completed_total", w.job, "all_reduce")], 20);
  EXPECT_EQ(m[OpSeries("hsdpd_op_bytes_total", w.job, "all_reduce")], 20 * 1024 * 4);
  EXPECT_EQ(m[OpSeries("hsdpd_op_duration_seconds_count", w.job, "all_reduce")], 20);
  EXPECT_EQ(m[OpSeries("hsdpd_op_queue_wait_seconds_count", w.job, "all_reduce")], 20);
  EXPECT_EQ(m[OpSeries("hsdpd_op_engine_wait_seconds_count", w.job, "all_reduce")], 20);
  // The +Inf bucket holds every observation.
  EXPECT_EQ(m["hsdpd_op_duration_seconds_bucket{dtype=\"float32\",group=\"world\",job_id=\"" +
              w.job + "\",op=\"all_reduce\",owner_uid=\"" + Owner() + "\",le=\"+Inf\"}"],
            20);
  EXPECT_EQ(m[OpSeries("hsdpd_ops_completed_total", w.job, "all_gather")], 5);
  EXPECT_EQ(m[OpSeries("hsdpd_op_bytes_total", w.job, "all_gather")], 5 * 256 * 4 * 2);
  const double last0 = m["hsdpd_rank_last_arrivals_total{job_id=\"metrics-job\",owner_uid=\"" +
                           Owner() + "\",rank=\"0\"}"];
  const double last1 = m["hsdpd_rank_last_arrivals_total{job_id=\"metrics-job\",owner_uid=\"" +
                           Owner() + "\",rank=\"1\"}"];
  EXPECT_EQ(last0 + last1, 25);  // every matched op had exactly one last rank
  EXPECT_EQ(m["hsdpd_rank_arrival_lag_seconds_count{job_id=\"metrics-job\",owner_uid=\"" +
              Owner() + "\",rank=\"0\"}"], 25);
  EXPECT_EQ(m["hsdpd_rank_arrival_lag_seconds_count{job_id=\"metrics-job\",owner_uid=\"" +
              Owner() + "\",rank=\"1\"}"], 25);
  EXPECT_GT(m["hsdpd_engine_busy_seconds_total"], 0);
  EXPECT_EQ(m["hsdpd_arena_ops{job_id=\"metrics-job\",owner_uid=\"" + Owner() + "\"}"], 0);
  EXPECT_EQ(m[std::string("hsdpd_build_info{version=\"") + kHsdpVersion + "\"}"], 1);
  // Low cardinality: no per-op identities in any label.
  for (const auto& [series, value] : m) {
    EXPECT_EQ(series.find("seq="), std::string::npos) << series;
    EXPECT_EQ(series.find("op_id="), std::string::npos) << series;
    EXPECT_TRUE(series.rfind("hsdpd_", 0) == 0 || series.rfind("exposer_", 0) == 0) << series;
  }

  // Released: the sessions end; the job's counters stay (for the retention).
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
  EXPECT_TRUE(Eventually([&] { return Scrape(port)["hsdpd_sessions"] == 0; }, 5000));
  m = Scrape(port);
  EXPECT_EQ(m["hsdpd_jobs"], 0);
  EXPECT_EQ(m[OpSeries("hsdpd_ops_completed_total", w.job, "all_reduce")], 20);
}

// Small operations of an all-local group run in its arena, which the daemon
// never sees: they are not in the op series, and hsdpd_arena_ops counts them.
TEST(ObservabilityMetricsTest, ArenaOperationsAreCountedApart) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("metrics:\n  listen: \"127.0.0.1:0\"\n")) << d.Log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "arena-job";
  w.all_reduces = 12;
  w.count = 256;  // 1 KiB: in the arena
  w.all_gathers = 3;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;
  std::map<std::string, double> m = Scrape(port);
  EXPECT_EQ(m["hsdpd_arena_ops{job_id=\"arena-job\",owner_uid=\"" + Owner() + "\"}"], 15);
  EXPECT_EQ(m[OpSeries("hsdpd_ops_completed_total", w.job, "all_reduce")], 0);
  EXPECT_EQ(m[OpSeries("hsdpd_ops_completed_total", w.job, "all_gather")], 0);
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
}

TEST(ObservabilityMetricsTest, MetricsAreOffByDefault) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(testing::kDaemonPathOnly)) << d.Log();
  v1::StatusResponse st;
  ASSERT_TRUE(QueryStatus(d.socket(), &st));
  EXPECT_EQ(st.metrics_address(), "");
  EXPECT_THAT(d.Log(), ::testing::Not(HasSubstr("/metrics")));
}

TEST(ObservabilityMetricsTest, PortInUseRefusesToStart) {
  TempDir dir;
  DaemonProcess first(dir);
  ASSERT_TRUE(first.Start(kMetricsConfig)) << first.Log();
  const int port = MetricsPort(first);
  ASSERT_GT(port, 0);
  TempDir dir2;
  DaemonProcess second(dir2);
  // The daemon may be seen listening on its Unix socket for a moment before
  // it fails to bind the metrics port: what matters is that it exits.
  (void)second.Start(std::string(testing::kDaemonPathOnly) + "metrics:\n  listen: \"127.0.0.1:" + std::to_string(port) + "\"\n");
  EXPECT_TRUE(testing::Eventually([&] { return !second.Alive(); }, 10000))
      << "a daemon whose metrics port is taken must not keep running";
  EXPECT_THAT(second.Log(), HasSubstr("metrics.listen"));
}

// --- A real Prometheus server -------------------------------------------------

// The value of a PromQL instant query with one result (NaN when none).
double PromQuery(int port, const std::string& promql, std::string* raw = nullptr) {
  std::string q;
  for (unsigned char c : promql) {
    if (std::isalnum(c) || c == '_' || c == '.') {
      q += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      q += buf;
    }
  }
  const std::string body = HttpGet(port, "/api/v1/query?query=" + q);
  if (raw != nullptr) *raw = body;
  google::protobuf::Struct s;
  if (!google::protobuf::util::JsonStringToMessage(body, &s).ok()) return NAN;
  const auto& result = s.fields().at("data").struct_value().fields().at("result").list_value();
  if (result.values_size() != 1) return NAN;
  const auto& value = result.values(0).struct_value().fields().at("value").list_value();
  return std::atof(value.values(1).string_value().c_str());
}

TEST(ObservabilityMetricsTest, PrometheusScrapesTheDaemon) {
  const std::string prometheus = "/usr/bin/prometheus";
  if (::access(prometheus.c_str(), X_OK) != 0) {
    GTEST_SKIP() << prometheus << " is not installed (Debian package `prometheus`, installed by "
                 << "tools/scripts/bootstrap.sh)";
  }
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(kMetricsConfig)) << d.Log();
  const int metrics_port = MetricsPort(d);
  ASSERT_GT(metrics_port, 0);

  const int prom_port = testing::FreeTcpPort();
  testing::WriteFile(dir.File("prometheus.yml"),
                     "global:\n  scrape_interval: 100ms\n  scrape_timeout: 100ms\n"
                     "scrape_configs:\n  - job_name: hsdpd\n    static_configs:\n"
                     "      - targets: [\"127.0.0.1:" +
                         std::to_string(metrics_port) + "\"]\n");
  testing::Subprocess prom({prometheus, "--config.file=" + dir.File("prometheus.yml"),
                            "--storage.tsdb.path=" + dir.File("tsdb"),
                            "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                           dir.File("prometheus.log"));
  if (!Eventually([&] { return PromQuery(prom_port, "up{job=\"hsdpd\"}") == 1; }, 10000)) {
    GTEST_SKIP() << "prometheus did not start or scrape within 10 s (port " << prom_port
                 << "); its log:\n"
                 << prom.Log();
  }

  Workload w;
  w.socket = d.socket();
  w.job = "prom-job";
  w.all_reduces = 30;
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();

  // Prometheus' own `job` label is the scrape job; ours is job_id.
  const std::string sel = "{job=\"hsdpd\",job_id=\"prom-job\",op=\"all_reduce\"}";
  std::string raw;
  EXPECT_TRUE(Eventually(
      [&] { return PromQuery(prom_port, "hsdpd_ops_completed_total" + sel, &raw) == 30; }, 10000))
      << raw;
  EXPECT_EQ(PromQuery(prom_port, "hsdpd_op_bytes_total" + sel), 30 * 1024 * 4);
  EXPECT_EQ(PromQuery(prom_port, "hsdpd_op_duration_seconds_count" + sel), 30);
  EXPECT_EQ(PromQuery(prom_port, "sum(hsdpd_rank_last_arrivals_total{job_id=\"prom-job\"})"), 30);
  EXPECT_EQ(
      PromQuery(prom_port, "count(hsdpd_rank_arrival_lag_seconds_count{job_id=\"prom-job\"})"),
      2);  // one series per rank
  EXPECT_TRUE(std::isnan(PromQuery(prom_port, "hsdpd_ops_failed_total{job_id=\"prom-job\"}")));
}

}  // namespace
}  // namespace hsdp
