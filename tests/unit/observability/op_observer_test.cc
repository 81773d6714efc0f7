// The Group -> OpObserver hooks (arrival, matched, launched, completed on
// success and on every failure path), and Observability fed by a real Group
// on a FakeEngine: straggler stats, per-job activity, the trace and the
// metrics text.
#include "daemon/dataplane/op_observer.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include "daemon/observability/observability.h"
#include "daemon/observability/trace_json.h"
#include "daemon/util/clock.h"
#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"
#include "common/wait.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;
using testing::FakeEngine;
using ::testing::HasSubstr;
using ::testing::Not;
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

  void TearDown() override {
    if (!password_file_.empty()) ::unlink(password_file_.c_str());
  }

  // Metrics with a password: the per-job series are kept (the view an
  // authenticated scrape gets).
  ObservabilityOptions WithPassword(uint32_t max_jobs_per_uid = 32) {
    if (password_file_.empty()) {
      char path[] = "/tmp/hsdp-metrics-password-XXXXXX";
      const int fd = ::mkstemp(path);
      EXPECT_GE(fd, 0);
      const std::string password = "0123456789abcdef0123456789abcdef\n";
      EXPECT_EQ(::write(fd, password.data(), password.size()),
                static_cast<ssize_t>(password.size()));
      ::close(fd);
      password_file_ = path;
    }
    ObservabilityOptions o("127.0.0.1:0", 0);
    o.metrics_password_file = password_file_;
    o.metrics_max_jobs_per_uid = max_jobs_per_uid;
    return o;
  }

  std::shared_ptr<Group> NewGroup(OpObserver* observer, int size = 3, uint32_t owner = 0,
                                  uint32_t id = 9, const std::string& job = "job",
                                  const Clock* clock = nullptr) {
    GroupSpec spec;
    spec.id = id;
    std::vector<int> ranks;
    for (int r = 0; r < size; ++r) ranks.push_back(r);
    spec.key = GroupKey(JobKey{owner, job}, ranks, 0);
    spec.job_id = job;
    spec.owner_uid = owner;
    spec.ranks = ranks;
    spec.timeout_ns = 1'000'000'000;
    spec.max_pending = 64;
    spec.observer = observer;
    spec.clock = clock;
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

  // Runs `n` matched and completed all-reduces on a 2-member group.
  void RunOps(Group& g, int n) {
    for (int i = 0; i < n; ++i) {
      const uint64_t seq = ++seq_[g.id()];
      g.Arrive(0, Make(0, seq));
      g.Arrive(1, Make(1, seq));
      engine_.Finish();
    }
  }

  FakeEngine engine_;
  std::vector<std::shared_ptr<Session>> sessions_;
  char mem_[64] = {};
  std::string password_file_;
  std::map<uint32_t, uint64_t> seq_;  // by group id
};

// What the test says is attached, for the metrics' gauge source.
class Attached {
 public:
  void Set(std::vector<NodeGauges::Job> jobs, std::vector<uint32_t> groups) {
    absl::MutexLock l(&mu_);
    g_.jobs = std::move(jobs);
    g_.group_ids = std::move(groups);
  }
  NodeGaugeSource Source() {
    return [this] {
      absl::MutexLock l(&mu_);
      return g_;
    };
  }

 private:
  absl::Mutex mu_;
  NodeGauges g_;
};

NodeGauges::Job AttachedJob(const std::string& name, uint32_t owner, std::vector<int> ranks) {
  NodeGauges::Job j;
  j.job_id = name;
  j.owner_uid = owner;
  j.ranks = std::move(ranks);
  return j;
}

// Lines of the exposition that are samples (not # HELP / # TYPE).
size_t SampleLines(const std::string& text) {
  size_t n = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) n += !line.empty() && line[0] != '#';
  return n;
}

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
  // The group's arrivals on a fake clock a second in the past (so they fall
  // within the trace's window, which ends at the real now).
  const int64_t t0 = shm::NowNanos() - 1'000'000'000;
  FakeClock clock(t0);
  ASSERT_TRUE((*obs)->trace().Arm(t0, 60'000'000'000));
  auto g = NewGroup(obs->get(), 2, 0, 9, "job", &clock);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    g->Arrive(0, Make(0, seq));
    clock.Advance(20'000'000);  // rank 1 is 20 ms late
    g->Arrive(1, Make(1, seq));
    engine_.Finish();
    clock.Advance(1'000'000);
  }
  const auto report = (*obs)->stragglers().Report("", std::nullopt);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].ops_matched, 3u);
  ASSERT_EQ(report[0].ranks.size(), 1u);
  const StragglerRankReport& r = report[0].ranks[0];
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.times_last, 3u);
  EXPECT_EQ(r.waited_ns_total, 3u * 20'000'000);
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
  auto obs = Observability::Create(WithPassword(), [] {
    NodeGauges g;
    g.sessions = 3;
    NodeGauges::Job j = AttachedJob("job", 0, {0, 1});
    j.ops_in_flight = 2;
    j.ring_occupancy = 0.25;
    j.priority_class = "batch";
    j.priority_level = 6;
    g.jobs.push_back(j);
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
  auto obs = Observability::Create(WithPassword(), [] {
    NodeGauges g;
    g.jobs.push_back(AttachedJob("job", 1000, {0, 1}));
    g.jobs.push_back(AttachedJob("job", 1001, {0, 1}));
    return g;
  });
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

// Without a password /metrics is not authenticated: it keeps and shows node
// totals only, nothing that names a job, its owner or its ranks.
TEST_F(ObserverTest, MetricsWithoutAPasswordShowNoJobs) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  auto obs = Observability::Create(ObservabilityOptions("127.0.0.1:0", 0), [] {
    NodeGauges g;
    g.sessions = 2;
    g.jobs.push_back(AttachedJob("secret-job", 1000, {0, 1}));
    g.jobs.back().ops_in_flight = 3;
    return g;
  });
  ASSERT_TRUE(obs.ok()) << obs.status();
  EXPECT_FALSE((*obs)->metrics()->job_series());
  auto g = NewGroup(obs->get(), 2, 1000, 9, "secret-job");
  RunOps(*g, 4);
  g->Arrive(0, Make(0, 5, 8));
  g->Arrive(1, Make(1, 5, 16));  // disagreement
  const std::string text = (*obs)->metrics()->Text();
  EXPECT_THAT(text, HasSubstr("hsdpd_node_ops_completed_total{dtype=\"float32\",group=\"sub\","
                              "op=\"all_reduce\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_node_op_bytes_total{dtype=\"float32\",group=\"sub\","
                              "op=\"all_reduce\"} 128\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_node_op_duration_seconds_count{op=\"all_reduce\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_node_ops_failed_total{op=\"all_reduce\","
                              "reason=\"invalid_argument\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_node_ops_in_flight 3\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_sessions 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("secret-job")));
  EXPECT_THAT(text, Not(HasSubstr("job_id")));
  EXPECT_THAT(text, Not(HasSubstr("owner_uid")));
  EXPECT_THAT(text, Not(HasSubstr("rank=")));
  EXPECT_EQ((*obs)->metrics()->Held().jobs, 0u);
}

// One owner holds at most max_jobs_per_uid of the per-job slots: its further
// jobs share its own "_other", and another owner's job still gets its own.
TEST_F(ObserverTest, MetricsGiveEachOwnerAShareOfTheJobSlots) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  Attached attached;
  auto obs = Observability::Create(WithPassword(/*max_jobs_per_uid=*/2), attached.Source());
  ASSERT_TRUE(obs.ok()) << obs.status();
  std::vector<NodeGauges::Job> jobs;
  std::vector<std::shared_ptr<Group>> groups;
  for (int j = 0; j < 5; ++j) {
    const std::string name = "mine-" + std::to_string(j);
    groups.push_back(NewGroup(obs->get(), 2, 1000, 10 + j, name));
    RunOps(*groups.back(), 1);
    jobs.push_back(AttachedJob(name, 1000, {0, 1}));
  }
  auto theirs = NewGroup(obs->get(), 2, 1001, 20, "theirs");
  RunOps(*theirs, 2);
  jobs.push_back(AttachedJob("theirs", 1001, {0, 1}));
  attached.Set(jobs, {});
  const std::string text = (*obs)->metrics()->Text();
  const std::string head =
      "hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\",job_id=\"";
  EXPECT_THAT(text, HasSubstr(head + "mine-0\",op=\"all_reduce\",owner_uid=\"1000\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(head + "mine-1\",op=\"all_reduce\",owner_uid=\"1000\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"mine-2\"")));
  EXPECT_THAT(text, HasSubstr(head + "_other\",op=\"all_reduce\",owner_uid=\"1000\"} 3\n"));
  EXPECT_THAT(text, HasSubstr(head + "theirs\",op=\"all_reduce\",owner_uid=\"1001\"} 2\n"));
  // The shared series have no per-rank series (they mix jobs' ranks), and
  // the gauges sum the jobs that share a label set.
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"_other\",owner_uid=\"1000\",rank=")));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_in_flight{job_id=\"_other\",owner_uid=\"1000\"} 0\n"));
  const MetricsHeld held = (*obs)->metrics()->Held();
  EXPECT_EQ(held.jobs, 3u);
  EXPECT_EQ(held.overflows, 1u);
}

// The default share: however many jobs one owner starts, another owner's
// job has series of its own.
TEST_F(ObserverTest, MetricsOneOwnerCannotTakeEverySlot) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  Attached attached;
  auto obs = Observability::Create(WithPassword(), attached.Source());
  ASSERT_TRUE(obs.ok()) << obs.status();
  std::vector<NodeGauges::Job> jobs;
  std::vector<std::shared_ptr<Group>> groups;
  for (uint32_t j = 0; j < Metrics::kMaxJobs + 10; ++j) {
    const std::string name = "flood-" + std::to_string(j);
    groups.push_back(NewGroup(obs->get(), 2, 1000, 100 + j, name));
    RunOps(*groups.back(), 1);
    jobs.push_back(AttachedJob(name, 1000, {0, 1}));
  }
  auto victim = NewGroup(obs->get(), 2, 1001, 50, "victim");
  RunOps(*victim, 1);
  jobs.push_back(AttachedJob("victim", 1001, {0, 1}));
  attached.Set(jobs, {});
  const std::string text = (*obs)->metrics()->Text();
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\","
                              "job_id=\"victim\",op=\"all_reduce\",owner_uid=\"1001\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\","
                              "job_id=\"_other\",op=\"all_reduce\",owner_uid=\"1000\"} " +
                              std::to_string(Metrics::kMaxJobs + 10 - 32) + "\n"));
  EXPECT_THAT(text, Not(HasSubstr("owner_uid=\"\"")));
  EXPECT_EQ((*obs)->metrics()->Held().jobs, 33u);
}

// A job's series go once it has no session attached, a rank's once no
// session of that rank is; the node totals keep counting.
TEST_F(ObserverTest, MetricsDropWhatIsNoLongerAttached) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  Attached attached;
  auto obs = Observability::Create(WithPassword(), attached.Source());
  ASSERT_TRUE(obs.ok()) << obs.status();
  auto g = NewGroup(obs->get(), 2, 1000, 9, "short");
  RunOps(*g, 3);
  attached.Set({AttachedJob("short", 1000, {0, 1})}, {9});
  std::string text = (*obs)->metrics()->Text();
  EXPECT_THAT(text, HasSubstr("job_id=\"short\",owner_uid=\"1000\",rank=\"1\""));
  // Rank 1 left; the job is still attached.
  attached.Set({AttachedJob("short", 1000, {0})}, {9});
  text = (*obs)->metrics()->Text();
  EXPECT_THAT(text, HasSubstr("job_id=\"short\",owner_uid=\"1000\",rank=\"0\""));
  EXPECT_THAT(text, Not(HasSubstr("rank=\"1\"")));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\","
                              "job_id=\"short\",op=\"all_reduce\",owner_uid=\"1000\"} 3\n"));
  // Gone.
  attached.Set({}, {});
  text = (*obs)->metrics()->Text();
  EXPECT_THAT(text, Not(HasSubstr("short")));
  EXPECT_THAT(text, HasSubstr("hsdpd_node_ops_completed_total{dtype=\"float32\",group=\"sub\","
                              "op=\"all_reduce\"} 3\n"));
  const MetricsHeld held = (*obs)->metrics()->Held();
  EXPECT_EQ(held.jobs, 0u);
  EXPECT_EQ(held.ranks, 0u);
  EXPECT_EQ(held.cached, 0u);
}

// Churn of short jobs and of ranks within a live job: the exposition
// returns to the same size however many there were.
TEST_F(ObserverTest, MetricsStayBoundedUnderChurn) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  Attached attached;
  auto obs = Observability::Create(WithPassword(), attached.Source());
  ASSERT_TRUE(obs.ok()) << obs.status();
  auto keeper = NewGroup(obs->get(), 2, 1000, 1, "keeper");
  const NodeGauges::Job keeper_job = AttachedJob("keeper", 1000, {0, 1});
  size_t after_first = 0;
  const std::vector<std::shared_ptr<Session>> fixture_sessions = sessions_;
  for (uint32_t i = 0; i < 200; ++i) {
    // A short job, and two more ranks of the long one that come and go
    // (other global ranks each time).
    const std::string name = "short-" + std::to_string(i);
    auto g = NewGroup(obs->get(), 2, 1000, 1000 + i, name);
    const int r0 = static_cast<int>(2 + 2 * i), r1 = r0 + 1;
    sessions_ = {MakeSession(10000 + 2 * i, r0, 1000, "keeper"),
                 MakeSession(10001 + 2 * i, r1, 1000, "keeper")};
    auto extra = NewGroup(obs->get(), 2, 1000, 100000 + i, "keeper");
    NodeGauges::Job keeper_now = keeper_job;
    keeper_now.ranks = {0, 1, r0, r1};
    attached.Set({keeper_now, AttachedJob(name, 1000, {0, 1})}, {1, 1000 + i, 100000 + i});
    RunOps(*extra, 2);
    sessions_ = fixture_sessions;
    RunOps(*g, 2);
    RunOps(*keeper, 1);
    g.reset();
    extra.reset();
    attached.Set({keeper_job}, {1});
    const std::string text = (*obs)->metrics()->Text();
    const size_t lines = SampleLines(text);
    if (i == 0) {
      after_first = lines;
      EXPECT_THAT(text, HasSubstr("job_id=\"keeper\",owner_uid=\"1000\",rank=\"1\""));
    }
    ASSERT_EQ(lines, after_first) << "after " << i + 1 << " short jobs:\n" << text;
    ASSERT_THAT(text, Not(HasSubstr("rank=\"" + std::to_string(r0) + "\"")));
  }
  EXPECT_EQ((*obs)->metrics()->Held().jobs, 1u);
}

// Without any scrape, a sweeper drops what is no longer attached once new
// series are made.
TEST_F(ObserverTest, MetricsSweepWithoutScrapes) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  Attached attached;
  // Every job gets a slot of its own (the share is not what this is about).
  auto obs = Observability::Create(WithPassword(/*max_jobs_per_uid=*/256), attached.Source());
  ASSERT_TRUE(obs.ok()) << obs.status();
  ASSERT_TRUE((*obs)->ServeMetrics().ok());
  for (uint32_t i = 0; i < 50; ++i) {
    const std::string name = "short-" + std::to_string(i);
    auto g = NewGroup(obs->get(), 2, 1000, 10 + i, name);
    attached.Set({AttachedJob(name, 1000, {0, 1})}, {10 + i});
    RunOps(*g, 1);
  }
  // Only the last job is attached: the others' series go without a scrape.
  const Metrics* m = (*obs)->metrics();
  (void)hsdp::testing::Eventually([&] { return m->Held().jobs <= 1; }, 30000, 5);
  const MetricsHeld held = m->Held();
  EXPECT_EQ(held.jobs, 1u);
  EXPECT_EQ(held.overflows, 0u);
  EXPECT_EQ(held.ranks, 2u);
  (*obs)->StopMetrics();
}

// daemon/observability/metrics.cc names every exported metric in quotes
// (the Grafana dashboard check reads them there): exactly the families an
// authenticated scrape serves once every kind of series exists.
TEST_F(ObserverTest, MetricsCcNamesEveryExportedMetric) {
  if (!Metrics::Available()) GTEST_SKIP() << "hsdpd built without prometheus-cpp";
  auto obs = Observability::Create(WithPassword(), [] {
    NodeGauges g;
    NodeGauges::Job j = AttachedJob("job", 0, {0, 1});
    j.priority_class = "batch";
    g.jobs.push_back(j);
    g.group_ids = {9};
    return g;
  });
  ASSERT_TRUE(obs.ok()) << obs.status();
  auto g = NewGroup(obs->get(), 2);
  RunOps(*g, 1);
  g->Arrive(0, Make(0, 2, 8));
  g->Arrive(1, Make(1, 2, 16));  // disagreement: a failure
  std::set<std::string> served;
  std::istringstream text((*obs)->metrics()->Text());
  for (std::string line; std::getline(text, line);) {
    if (line.rfind("# TYPE hsdpd_", 0) == 0) served.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  std::ifstream source(HSDP_SOURCE_DIR "/daemon/observability/metrics.cc");
  ASSERT_TRUE(source.good());
  const std::string code((std::istreambuf_iterator<char>(source)),
                         std::istreambuf_iterator<char>());
  std::set<std::string> named;
  static const std::regex kQuoted("\"(hsdpd_[a-z_]+)\"");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), kQuoted);
       it != std::sregex_iterator(); ++it) {
    named.insert((*it)[1]);
  }
  EXPECT_EQ(named, served);
}

}  // namespace
}  // namespace hsdp
