// The Group -> OpObserver hooks (arrival, matched, launched, completed on
// success and on every failure path), and Observability fed by a real Group
// on a FakeEngine: straggler stats, per-job activity, the trace and the
// metrics text.
#include "daemon/dataplane/op_observer.h"

#include <thread>

#include "daemon/observability/observability.h"
#include "daemon/observability/trace_json.h"
#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;
using testing::FakeEngine;
using ::testing::HasSubstr;
using testing::MakeSession;

// Logs every hook as "<hook> <global rank(s)> seq <n> [status]".
class RecordingObserver : public OpObserver {
 public:
  void OnArrival(const GroupSpec&, const Arrival& a) override {
    log.push_back(absl::StrCat("arrival ", a.session->info().rank, " seq ", a.seq));
  }
  void OnMatched(const GroupSpec&, const std::map<int, Arrival>& arrivals) override {
    log.push_back(absl::StrCat("matched ", arrivals.size(), " seq ", arrivals.begin()->second.seq));
  }
  void OnLaunched(const GroupSpec&, const Arrival& a, uint64_t ticket) override {
    log.push_back(absl::StrCat("launched seq ", a.seq, ticket > 0 ? "" : " (no ticket)"));
  }
  void OnCompleted(const GroupSpec&, const std::vector<Arrival>& arrivals, const absl::Status& s,
                   uint64_t, uint64_t) override {
    log.push_back(absl::StrCat("completed ", arrivals.size(), " seq ", arrivals[0].seq, " ",
                               absl::StatusCodeToString(s.code())));
  }
  std::vector<std::string> log;
};

class ObserverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 3; ++r) sessions_.push_back(MakeSession(100 + r, r, 3));
  }

  std::shared_ptr<Group> NewGroup(OpObserver* observer, int size = 3, uint32_t owner = 0,
                                  uint32_t id = 9) {
    GroupSpec spec;
    spec.id = id;
    std::vector<int> ranks;
    for (int r = 0; r < size; ++r) ranks.push_back(r);
    spec.key = GroupKey(JobKey{owner, "job"}, ranks, 0);
    spec.job_id = "job";
    spec.owner_uid = owner;
    spec.ranks = ranks;
    spec.timeout_ns = 1'000'000'000;
    spec.max_pending = 64;
    spec.observer = observer;
    auto g = std::make_shared<Group>(std::move(spec), &engine_,
                                     [](uint32_t) { return std::shared_ptr<Group>(); });
    for (int r = 0; r < size; ++r) EXPECT_TRUE(g->Join(r, sessions_[r]).ok());
    return g;
  }

  Arrival Make(int rank, uint64_t seq, uint64_t count = 8) {
    Arrival a;
    a.session = sessions_[rank];
    a.desc.op_id = seq;
    a.desc.seq = seq;
    a.desc.collective = static_cast<uint8_t>(Collective::kAllReduce);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    a.desc.count = count;
    a.desc.premul_factor = a.desc.pre_divide = a.desc.post_divide = 1.0;
    a.desc.group_id = 9;
    a.desc.epoch = 1;
    a.epoch = 1;
    a.seq = seq;
    a.send = mem_;
    a.recv = mem_;
    a.first_ns = shm::NowNanos();
    return a;
  }

  FakeEngine engine_;
  std::vector<std::shared_ptr<Session>> sessions_;
  char mem_[64] = {};
};

TEST_F(ObserverTest, SuccessReportsEveryStageOnce) {
  RecordingObserver obs;
  auto g = NewGroup(&obs);
  g->Arrive(0, Make(0, 1));
  g->Arrive(2, Make(2, 1));
  g->Arrive(1, Make(1, 1));
  engine_.Finish();
  EXPECT_THAT(obs.log, ElementsAre("arrival 0 seq 1", "arrival 2 seq 1", "arrival 1 seq 1",
                                   "matched 3 seq 1", "launched seq 1", "completed 3 seq 1 OK"));
}

TEST_F(ObserverTest, FailuresReportCompletionWithTheError) {
  RecordingObserver obs;
  auto g = NewGroup(&obs);
  // Disagreement: completes for all with the error, never matched or launched.
  g->Arrive(0, Make(0, 1, 8));
  g->Arrive(1, Make(1, 1, 8));
  g->Arrive(2, Make(2, 1, 16));
  EXPECT_EQ(obs.log.back(), "completed 3 seq 1 INVALID_ARGUMENT");
  EXPECT_EQ(std::count_if(obs.log.begin(), obs.log.end(),
                          [](const std::string& l) { return l.rfind("matched", 0) == 0; }),
            0);
  // A refused submission (seq 1 already failed) completes alone.
  obs.log.clear();
  g->Arrive(0, Make(0, 1));
  EXPECT_THAT(obs.log, ElementsAre("arrival 0 seq 1", "completed 1 seq 1 INVALID_ARGUMENT"));
  // A member leaving fails the pending op of the others.
  obs.log.clear();
  g->Arrive(0, Make(0, 2));
  g->MemberLeft(sessions_[2].get(), "test");
  EXPECT_THAT(obs.log, ElementsAre("arrival 0 seq 2", "completed 1 seq 2 ABORTED"));
}

TEST_F(ObserverTest, ObservabilityAttributesStragglersAndTraces) {
  auto obs = Observability::Create(ObservabilityOptions{"", 4096}, nullptr);
  ASSERT_TRUE(obs.ok()) << obs.status();
  const int64_t t0 = shm::NowNanos();
  ASSERT_TRUE((*obs)->trace().Arm(t0, 60'000'000'000));
  auto g = NewGroup(obs->get(), 2);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    g->Arrive(0, Make(0, seq));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 1 is late
    g->Arrive(1, Make(1, seq));
    engine_.Finish();
  }
  const auto report = (*obs)->stragglers().Report("", std::nullopt);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].ops_matched, 3u);
  ASSERT_EQ(report[0].ranks.size(), 1u);
  const StragglerRankReport& r = report[0].ranks[0];
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.times_last, 3u);
  EXPECT_GE(r.waited_ns_total, 3u * 20'000'000);
  EXPECT_LT(r.waited_ns_total, 3u * 500'000'000);
  ASSERT_EQ(r.recent.size(), 3u);
  EXPECT_EQ(r.recent[2].op, "all_reduce");
  EXPECT_EQ(r.recent[2].seq, 3u);

  const auto activity = (*obs)->Activity(std::nullopt);
  ASSERT_EQ(activity.size(), 1u);
  EXPECT_EQ(activity[0].ops_completed, 3u);
  EXPECT_EQ(activity[0].bytes, 3u * 8 * 4);

  const TraceSnapshot snap = (*obs)->trace().Window(t0, shm::NowNanos(), -1, "");
  // Per op: 2 arrivals, 1 match, 1 launch, 2 completions.
  EXPECT_EQ(snap.events.size(), 3u * 6);
  TraceSummary sum;
  const std::string json = RenderChromeTrace(snap, t0, shm::NowNanos(), &sum);
  EXPECT_EQ(sum.member_ops, 6u);
  EXPECT_EQ(sum.ops, 3u);
  EXPECT_THAT(json, HasSubstr("\"name\":\"arrived last\""));
  EXPECT_THAT(json, HasSubstr("rank 1 (session 101)"));
}

TEST_F(ObserverTest, NotRecordingLeavesTheRingEmpty) {
  auto obs = Observability::Create(ObservabilityOptions{"", 4096}, nullptr);
  ASSERT_TRUE(obs.ok());
  auto g = NewGroup(obs->get(), 2);
  g->Arrive(0, Make(0, 1));
  g->Arrive(1, Make(1, 1));
  engine_.Finish();
  EXPECT_TRUE((*obs)->trace().Window(0, INT64_MAX, -1, "").events.empty());
  EXPECT_EQ((*obs)->Activity(std::nullopt).at(0).ops_completed, 1u);
}

TEST_F(ObserverTest, MetricsCountCompletedFailedAndLateRanks) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  // A listen address creates the metrics; without ServeMetrics nothing binds.
  auto obs = Observability::Create(ObservabilityOptions{"127.0.0.1:0", 0}, [] {
    NodeGauges g;
    g.sessions = 3;
    g.jobs.push_back({"job", 2, 0.25, 0, "batch", 6});
    return g;
  });
  ASSERT_TRUE(obs.ok()) << obs.status();
  ASSERT_NE((*obs)->metrics(), nullptr);
  auto g = NewGroup(obs->get(), 2);
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    g->Arrive(0, Make(0, seq));
    g->Arrive(1, Make(1, seq));
    engine_.Finish();
  }
  g->Arrive(0, Make(0, 5, 8));
  g->Arrive(1, Make(1, 5, 16));  // disagreement
  const std::string text = (*obs)->metrics()->Text();
  const std::string labels =
      "{dtype=\"float32\",group=\"sub\",job_id=\"job\",op=\"all_reduce\",owner_uid=\"0\"}";
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_completed_total" + labels + " 4\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_op_bytes_total" + labels + " 128\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_op_duration_seconds_count" + labels + " 4\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_failed_total{dtype=\"float32\",group=\"sub\","
                              "job_id=\"job\",op=\"all_reduce\",owner_uid=\"0\","
                              "reason=\"invalid_argument\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_rank_arrival_lag_seconds_count{job_id=\"job\",owner_uid=\"0\","
                              "rank=\"1\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_sessions 3\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_in_flight{job_id=\"job\",owner_uid=\"0\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("hsdpd_ring_occupancy_ratio{job_id=\"job\",owner_uid=\"0\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_job_priority_level{job_id=\"job\",owner_uid=\"0\","
                              "priority_class=\"batch\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_build_info{version="));
  // Every op had a last rank: the counts add up to the matched ops.
  int last = 0;
  for (const char* r : {"0", "1"}) {
    const std::string key =
        std::string("hsdpd_rank_last_arrivals_total{job_id=\"job\",owner_uid=\"0\",rank=\"") + r +
        "\"} ";
    const size_t at = text.find(key);
    if (at != std::string::npos) last += std::stoi(text.substr(at + key.size()));
  }
  EXPECT_EQ(last, 4);
}

// A job is its owner plus its name: two uids' "job" are two series sets.
TEST_F(ObserverTest, MetricsKeepSameNamedJobsOfTwoUidsApart) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  auto obs = Observability::Create(ObservabilityOptions{"127.0.0.1:0", 0}, nullptr);
  ASSERT_TRUE(obs.ok()) << obs.status();
  auto mine = NewGroup(obs->get(), 2, /*owner=*/1000, /*id=*/9);
  auto theirs = NewGroup(obs->get(), 2, /*owner=*/1001, /*id=*/10);
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    mine->Arrive(0, Make(0, seq));
    mine->Arrive(1, Make(1, seq));
    engine_.Finish();
  }
  theirs->Arrive(0, Make(0, 1));
  theirs->Arrive(1, Make(1, 1));
  engine_.Finish();
  const std::string text = (*obs)->metrics()->Text();
  const std::string head =
      "hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\",job_id=\"job\","
      "op=\"all_reduce\",owner_uid=\"";
  EXPECT_THAT(text, HasSubstr(head + "1000\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(head + "1001\"} 1\n"));
  const auto activity = (*obs)->Activity(std::nullopt);
  ASSERT_EQ(activity.size(), 2u);
  EXPECT_EQ(activity[0].uid, 1000u);
  EXPECT_EQ(activity[0].ops_completed, 2u);
  EXPECT_EQ(activity[1].uid, 1001u);
  EXPECT_EQ(activity[1].ops_completed, 1u);
  ASSERT_EQ((*obs)->Activity(1001u).size(), 1u);
}

}  // namespace
}  // namespace hsdp
