// Straggler attribution through a real hsdpd: one rank sleeps before every
// submission; `hsdpctl stragglers`, its --json form and hsdp::QueryStragglers
// name that rank first with the delay (within a tolerance), and `hsdpctl
// top` shows the job and its slowest rank in a one-shot snapshot.
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "hsdp/stragglers.h"
#include "observability_util.h"

namespace hsdp {
namespace {

using testing::Child;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::Workload;

constexpr int kOps = 10;
constexpr int kDelayMs = 40;

TEST(ObservabilityStragglersTest, NamesTheDelayedRankAndTheDelay) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(testing::kDaemonPathOnly)) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "straggler-job";
  w.world = 3;
  w.all_reduces = kOps;
  w.slow_rank = 2;
  w.delay_ms = kDelayMs;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;

  // One-shot `top` (stdout is a pipe) while the job is attached.
  const auto top = testing::RunCommand(testing::Hsdpctl(d.socket(), "top --interval 0.2"));
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("straggler-job"));
  EXPECT_THAT(top.output, HasSubstr("3/3"));
  EXPECT_THAT(top.output, HasSubstr("rank 2 ("));

  testing::WriteFile(w.hold_file, "");
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();

  // JSON, as scripts read it.
  const auto js =
      testing::RunCommand(testing::Hsdpctl(d.socket(), "--json stragglers --job straggler-job"));
  ASSERT_EQ(js.exit_code, 0) << js.output;
  v1::StragglersResponse resp;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(js.output, &resp).ok()) << js.output;
  ASSERT_EQ(resp.jobs_size(), 1);
  EXPECT_EQ(resp.jobs(0).ops_matched(), kOps);
  ASSERT_GE(resp.ranks_size(), 1);
  const v1::StragglerRank& top_rank = resp.ranks(0);
  EXPECT_EQ(top_rank.rank(), 2);
  EXPECT_EQ(top_rank.times_last(), kOps);
  // Each wait is the sleep (>= 40 ms) less whatever rank 0/1 were late
  // themselves; on a shared 2-core machine allow a wide upper bound.
  EXPECT_GE(top_rank.waited_seconds_total(), kOps * kDelayMs * 0.75 / 1e3);
  EXPECT_LE(top_rank.waited_seconds_total(), kOps * kDelayMs * 4.0 / 1e3);
  EXPECT_GE(top_rank.p50_seconds(), kDelayMs * 0.75 / 1e3);
  EXPECT_LE(top_rank.p50_seconds(), kDelayMs * 4.0 / 1e3);
  EXPECT_GE(top_rank.max_seconds(), top_rank.p99_seconds());
  ASSERT_EQ(top_rank.recent_size(), kOps);
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(top_rank.recent(i).op(), "all_reduce");
    EXPECT_EQ(top_rank.recent(i).seq(), static_cast<uint64_t>(i + 1));
  }
  for (int i = 1; i < resp.ranks_size(); ++i) EXPECT_EQ(resp.ranks(i).times_last(), 0u);

  // The table.
  const auto table = testing::RunCommand(testing::Hsdpctl(d.socket(), "stragglers"));
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("job straggler-job (uid " + std::to_string(::geteuid()) +
                                      "): 10 operations matched"));
  EXPECT_THAT(table.output, HasSubstr("all_reduce group"));

  // The C++ API (forked children first, gRPC in this process only now).
  auto report = QueryStragglers(d.socket(), "straggler-job");
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->ranks.empty());
  EXPECT_EQ(report->ranks[0].rank, 2);
  EXPECT_EQ(report->ranks[0].times_last, static_cast<uint64_t>(kOps));
  EXPECT_NEAR(report->ranks[0].waited_seconds_total, top_rank.waited_seconds_total(), 1e-9);
  EXPECT_EQ(report->ops_matched.at("straggler-job"), static_cast<uint64_t>(kOps));
  auto other = QueryStragglers(d.socket(), "no-such-job");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->ranks.empty());
}

TEST(ObservabilityStragglersTest, NoDaemonIsUnavailable) {
  TempDir dir;
  auto r = QueryStragglers(dir.File("none.sock"), "", absl::Seconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

}  // namespace
}  // namespace hsdp
