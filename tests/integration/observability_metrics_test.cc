// Prometheus metrics of a real hsdpd: /metrics scraped directly and parsed
// (series, values that match the workload exactly, gauges while sessions
// are attached), what a scraper without the password learns (no job names),
// the password file's rules, series bounded by what is attached under
// churn, a port that cannot be bound, and — where the `prometheus` binary is
// installed — a real Prometheus server scraping the daemon with the
// password, with the counters checked through its HTTP query API.
#include <sys/stat.h>
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
using ::testing::Not;
using testing::HttpGet;
using testing::NowMs;
using testing::ParsePromText;
using testing::PortOf;
using testing::QueryStatus;
using testing::TempDir;
using testing::Workload;

const std::string kMetricsConfig =
    std::string(testing::kDaemonPathOnly) + "metrics:\n  listen: \"127.0.0.1:0\"\n";
const std::string kPassword = "5f0c1e8a9b7d4c3e2a1f0e9d8c7b6a55";

// Writes `password` to dir/metrics.password with `mode`; the config that
// serves /metrics behind it.
std::string AuthConfig(const TempDir& dir, const std::string& password = kPassword,
                       mode_t mode = 0600, const std::string& base = kMetricsConfig) {
  const std::string file = dir.File("metrics.password");
  testing::WriteFile(file, password + "\n");
  ::chmod(file.c_str(), mode);
  return base + "  password_file: \"" + file + "\"\n  username: scraper\n";
}

// The daemon's metrics port, from `hsdpctl --json status`.
int MetricsPort(const DaemonProcess& d) {
  v1::StatusResponse st;
  if (!QueryStatus(d.socket(), &st)) return 0;
  return PortOf(st.metrics_address());
}

// /metrics with the password.
std::string ScrapeText(int port) {
  int status = 0;
  const std::string text =
      HttpGet(port, "/metrics", &status, testing::BasicAuth("scraper", kPassword));
  EXPECT_EQ(status, 200);
  return text;
}

std::map<std::string, double> Scrape(int port) {
  const std::string text = ScrapeText(port);
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
  ASSERT_TRUE(d.Start(AuthConfig(dir))) << d.Log();
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

  // Released: the sessions end, and with them the job's series; the node
  // totals keep its operations.
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
  EXPECT_TRUE(Eventually([&] { return Scrape(port)["hsdpd_sessions"] == 0; }, 5000));
  m = Scrape(port);
  EXPECT_EQ(m["hsdpd_jobs"], 0);
  for (const auto& [series, value] : m) {
    EXPECT_EQ(series.find("metrics-job"), std::string::npos) << series;
  }
  EXPECT_EQ(
      m["hsdpd_node_ops_completed_total{dtype=\"float32\",group=\"world\",op=\"all_reduce\"}"],
      20);
  EXPECT_EQ(m["hsdpd_node_ops_completed_total{dtype=\"float32\",group=\"world\",op=\"all_gather\"}"],
            5);
}

// Small operations of an all-local group run in its arena, which the daemon
// never sees: they are not in the op series, and hsdpd_arena_ops counts them.
TEST(ObservabilityMetricsTest, ArenaOperationsAreCountedApart) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(AuthConfig(dir, kPassword, 0600, "metrics:\n  listen: \"127.0.0.1:0\"\n")))
      << d.Log();
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

// A scraper without the password gets 401 and nothing else; a wrong user or
// password is refused the same way; with both, the job's series.
TEST(ObservabilityMetricsTest, OnlyTheScraperWithThePasswordSeesJobs) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(AuthConfig(dir))) << d.Log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "secret-job";
  w.all_reduces = 3;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;

  const std::pair<const char*, std::string> refused[] = {
      {"no credentials", ""},
      {"wrong password", testing::BasicAuth("scraper", kPassword + "x")},
      {"password prefix", testing::BasicAuth("scraper", kPassword.substr(0, 16))},
      {"wrong user", testing::BasicAuth("hsdpd", kPassword)},
      {"not basic", "Authorization: Bearer " + kPassword + "\r\n"},
      {"bad base64", "Authorization: Basic %%%%\r\n"},
  };
  for (const auto& [what, header] : refused) {
    int status = 0;
    const std::string body = HttpGet(port, "/metrics", &status, header);
    EXPECT_EQ(status, 401) << what;
    EXPECT_EQ(body.find("secret-job"), std::string::npos) << what << ": " << body;
    EXPECT_EQ(body.find("hsdpd_"), std::string::npos) << what << ": " << body;
  }
  const std::string text = ScrapeText(port);
  EXPECT_THAT(text, HasSubstr("job_id=\"secret-job\""));
  EXPECT_THAT(text, HasSubstr("rank=\"1\""));
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
}

// Without a password anyone who reaches the port may scrape: node totals
// only, nothing that names a job, an owner or a rank.
TEST(ObservabilityMetricsTest, WithoutAPasswordOnlyNodeTotals) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(kMetricsConfig)) << d.Log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "secret-job";
  w.all_reduces = 7;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;
  int status = 0;
  const std::string text = HttpGet(port, "/metrics", &status);
  EXPECT_EQ(status, 200);
  EXPECT_THAT(text, Not(HasSubstr("secret-job")));
  EXPECT_THAT(text, Not(HasSubstr("job_id")));
  EXPECT_THAT(text, Not(HasSubstr("owner_uid")));
  EXPECT_THAT(text, Not(HasSubstr("rank=")));
  std::map<std::string, double> m;
  std::string bad;
  ASSERT_TRUE(ParsePromText(text, &m, &bad)) << bad;
  EXPECT_EQ(m["hsdpd_sessions"], 2);
  EXPECT_EQ(m["hsdpd_jobs"], 1);
  EXPECT_EQ(
      m["hsdpd_node_ops_completed_total{dtype=\"float32\",group=\"world\",op=\"all_reduce\"}"],
      7);
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
}

// The password file must be private to the daemon: else hsdpd does not start.
TEST(ObservabilityMetricsTest, APasswordFileOthersCanReadIsRefused) {
  struct Case {
    const char* what;
    std::string password;
    mode_t mode;
    const char* expect;
  };
  const Case cases[] = {
      {"group-readable", kPassword, 0640, "chmod 0600"},
      {"world-readable", kPassword, 0604, "chmod 0600"},
      {"too short", "short", 0600, "at least 16"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    DaemonProcess d(dir);
    (void)d.Start(AuthConfig(dir, c.password, c.mode), {}, {}, /*wait_ready=*/false);
    EXPECT_TRUE(Eventually([&] { return !d.Alive(); }, 10000)) << c.what;
    EXPECT_THAT(d.Log(), HasSubstr("metrics.password_file")) << c.what;
    EXPECT_THAT(d.Log(), HasSubstr(c.expect)) << c.what << ": " << d.Log();
  }
  TempDir dir;
  DaemonProcess d(dir);
  (void)d.Start(kMetricsConfig + "  password_file: \"" + dir.File("missing") + "\"\n", {}, {},
                /*wait_ready=*/false);
  EXPECT_TRUE(Eventually([&] { return !d.Alive(); }, 10000));
  EXPECT_THAT(d.Log(), HasSubstr("cannot open"));
}

// Short jobs, and ranks of a long job that come and go: once they left,
// /metrics is back to what it was after the first of them, however many
// there were.
TEST(ObservabilityMetricsTest, ChurnLeavesTheSeriesBounded) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(AuthConfig(dir))) << d.Log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.Log();
  constexpr int kIterations = 25;
  constexpr int kWorld = 2 + 2 * kIterations;
  Workload keeper;
  keeper.socket = d.socket();
  keeper.job = "keeper";
  keeper.world_size = kWorld;
  keeper.all_reduces = 2;
  keeper.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> keepers;
  std::string why;
  ASSERT_TRUE(RunWorkload(keeper, &keepers, &why)) << why;

  size_t first_lines = 0, first_bytes = 0;
  for (int i = 0; i < kIterations; ++i) {
    Workload more = keeper;  // two more ranks of the long job
    more.first_rank = 2 + 2 * i;
    more.hold_file.clear();
    Workload short_job;
    short_job.socket = d.socket();
    short_job.job = "short-" + std::to_string(i);
    short_job.all_reduces = 2;
    std::vector<std::unique_ptr<Child>> ranks;
    ASSERT_TRUE(RunWorkload(more, &ranks, &why)) << why;
    ASSERT_TRUE(RunWorkload(short_job, &ranks, &why)) << why;
    for (auto& r : ranks) ASSERT_EQ(r->Finish(15000), 0) << r->output();
    ASSERT_TRUE(Eventually([&] { return Scrape(port)["hsdpd_sessions"] == 2; }, 10000));
    const std::string text = ScrapeText(port);
    std::map<std::string, double> m;
    std::string bad;
    ASSERT_TRUE(ParsePromText(text, &m, &bad)) << bad;
    for (const auto& [series, value] : m) {
      ASSERT_EQ(series.find("short-"), std::string::npos) << series;
      ASSERT_EQ(series.find("rank=\"" + std::to_string(more.first_rank) + "\""),
                std::string::npos)
          << series;
    }
    if (i == 0) {
      first_lines = m.size();
      first_bytes = text.size();
    }
    EXPECT_EQ(m.size(), first_lines) << "after " << i + 1 << " iterations";
    if (i == kIterations - 1) {
      std::printf("after 1 iteration: %zu series, %zu bytes; after %d: %zu series, %zu bytes\n",
                  first_lines, first_bytes, kIterations, m.size(), text.size());
    }
  }
  testing::WriteFile(keeper.hold_file, "");
  for (auto& r : keepers) EXPECT_EQ(r->Finish(15000), 0) << r->output();
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
  ASSERT_TRUE(d.Start(AuthConfig(dir))) << d.Log();
  const int metrics_port = MetricsPort(d);
  ASSERT_GT(metrics_port, 0);

  // Prometheus reads the same password file (as deploy/prometheus/ shows).
  const int prom_port = testing::FreePort();
  testing::WriteFile(dir.File("prometheus.yml"),
                     "global:\n  scrape_interval: 100ms\n  scrape_timeout: 100ms\n"
                     "scrape_configs:\n  - job_name: hsdpd\n"
                     "    basic_auth:\n      username: scraper\n      password_file: " +
                         dir.File("metrics.password") +
                         "\n    static_configs:\n"
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
  w.hold_file = dir.File("release");  // attached until Prometheus saw it
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;

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
  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
}

}  // namespace
}  // namespace hsdp
