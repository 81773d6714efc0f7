// JobMetrics' own rules (daemon/observability/job_metrics.h), driven
// directly: the per-owner share of the job slots and each owner's own
// overflow, the last-resort overflow, a job keeping its series set while
// attached, the rank cap, and the retirement of what is no longer attached.
#include "daemon/observability/job_metrics.h"

#include <sstream>
#include <string>
#include <vector>

#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::MakeSession;

class JobMetricsTest : public ::testing::Test {
 protected:
  void Make(uint32_t max_jobs_per_uid) {
    jobs_ = std::make_unique<JobMetrics>(max_jobs_per_uid, [this] { ++new_series_; });
  }

  static GroupSpec Spec(uint32_t id, uint32_t owner, const std::string& job) {
    GroupSpec spec;
    spec.id = id;
    spec.job_id = job;
    spec.owner_uid = owner;
    spec.ranks = {0, 1};
    return spec;
  }

  static Arrival ArrivalOf(std::shared_ptr<Session> session, int64_t arrived_ns) {
    Arrival a;
    a.session = std::move(session);
    a.desc.collective = static_cast<uint8_t>(Collective::kAllReduce);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.count = 8;
    a.arrived_ns = arrived_ns;
    return a;
  }

  // One successful operation of `spec`'s job (no per-rank series).
  void Complete(const GroupSpec& spec) {
    jobs_->OnCompleted(spec, ArrivalOf(nullptr, 0), absl::OkStatus(), 1000, 2000);
  }

  // One matched operation of global ranks r0 and r1 (r1 last).
  void Match(const GroupSpec& spec, int r0, int r1) {
    std::map<int, Arrival> arrivals;
    arrivals[0] = ArrivalOf(MakeSession(1, r0, 2048), 100);
    arrivals[1] = ArrivalOf(MakeSession(2, r1, 2048), 300);
    jobs_->OnMatched(spec, arrivals);
  }

  static NodeGauges::Job Attached(const std::string& name, uint32_t owner,
                                  std::vector<int> ranks = {}) {
    NodeGauges::Job j;
    j.job_id = name;
    j.owner_uid = owner;
    j.ranks = std::move(ranks);
    return j;
  }

  // A scrape's retirement: a generation begins, then `g` is what is attached.
  void Scrape(const NodeGauges& g) { jobs_->Retire(g, jobs_->NextGeneration()); }

  std::string Text(const NodeGauges& g = {}) {
    std::vector<prometheus::MetricFamily> families = jobs_->registry()->Collect();
    jobs_->JobGauges(g, &families);
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  static std::string Completed(const std::string& job, const std::string& owner) {
    return "hsdpd_ops_completed_total{dtype=\"float32\",group=\"sub\",job_id=\"" + job +
           "\",op=\"all_reduce\",owner_uid=\"" + owner + "\"} ";
  }

  std::unique_ptr<JobMetrics> jobs_;
  int new_series_ = 0;
};

TEST_F(JobMetricsTest, AnOwnersFurtherJobsShareItsOwnOverflow) {
  Make(/*max_jobs_per_uid=*/2);
  for (int j = 0; j < 5; ++j) Complete(Spec(10 + j, 1000, "mine-" + std::to_string(j)));
  Complete(Spec(20, 1001, "theirs"));
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr(Completed("mine-0", "1000") + "1\n"));
  EXPECT_THAT(text, HasSubstr(Completed("mine-1", "1000") + "1\n"));
  EXPECT_THAT(text, Not(HasSubstr("mine-2")));
  EXPECT_THAT(text, HasSubstr(Completed("_other", "1000") + "3\n"));
  EXPECT_THAT(text, HasSubstr(Completed("theirs", "1001") + "1\n"));
  const MetricsHeld held = jobs_->Held();
  EXPECT_EQ(held.jobs, 3u);
  EXPECT_EQ(held.overflows, 1u);
  // Each series set made asked for a sweep once: 3 jobs, 1 overflow.
  EXPECT_EQ(new_series_, 4);
}

TEST_F(JobMetricsTest, AJobNamedLikeTheOverflowSharesIt) {
  Make(32);
  Complete(Spec(1, 1000, "_other"));
  const MetricsHeld held = jobs_->Held();
  EXPECT_EQ(held.jobs, 0u);
  EXPECT_EQ(held.overflows, 1u);
  EXPECT_THAT(Text(), HasSubstr(Completed("_other", "1000") + "1\n"));
}

TEST_F(JobMetricsTest, OwnersPastTheOverflowLimitShareOneWithoutAnOwner) {
  Make(/*max_jobs_per_uid=*/1);
  // kMaxJobs owners with one slot each and an overflow each.
  for (uint32_t owner = 0; owner < Metrics::kMaxJobs; ++owner) {
    Complete(Spec(2 * owner, owner, "a"));
    Complete(Spec(2 * owner + 1, owner, "b"));
  }
  EXPECT_EQ(jobs_->Held().jobs, Metrics::kMaxJobs);
  EXPECT_EQ(jobs_->Held().overflows, Metrics::kMaxJobs);
  EXPECT_THAT(Text(), Not(HasSubstr("owner_uid=\"\"")));
  // No slot and no overflow of its own left for a new owner.
  Complete(Spec(100000, 99999, "late"));
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr(Completed("_other", "") + "1\n"));
  EXPECT_THAT(text, Not(HasSubstr("99999")));
  EXPECT_EQ(jobs_->Held().overflows, Metrics::kMaxJobs + 1);
}

TEST_F(JobMetricsTest, AJobKeepsItsSetWhileAttached) {
  Make(/*max_jobs_per_uid=*/1);
  Complete(Spec(1, 1000, "first"));
  Complete(Spec(2, 1000, "folded"));
  EXPECT_THAT(Text(), HasSubstr(Completed("_other", "1000") + "1\n"));
  // "first" goes and frees its slot; "folded" stays in the overflow.
  NodeGauges g;
  g.jobs = {Attached("folded", 1000)};
  g.group_ids = {2};
  Scrape(g);
  Complete(Spec(2, 1000, "folded"));
  Complete(Spec(3, 1000, "next"));  // the freed slot
  const std::string text = Text(g);
  EXPECT_THAT(text, Not(HasSubstr("\"first\"")));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"folded\"")));
  EXPECT_THAT(text, HasSubstr(Completed("_other", "1000") + "2\n"));
  EXPECT_THAT(text, HasSubstr(Completed("next", "1000") + "1\n"));
  EXPECT_EQ(jobs_->Held().jobs, 1u);
}

TEST_F(JobMetricsTest, RetireDropsWhatIsNoLongerAttached) {
  Make(32);
  const GroupSpec spec = Spec(9, 1000, "job");
  Match(spec, 0, 1);
  Complete(spec);
  EXPECT_THAT(Text(), HasSubstr("job_id=\"job\",owner_uid=\"1000\",rank=\"1\""));
  EXPECT_EQ(jobs_->Held().ranks, 2u);
  // Rank 1 left, the job is still attached.
  NodeGauges g;
  g.jobs = {Attached("job", 1000, {0})};
  g.group_ids = {9};
  Scrape(g);
  std::string text = Text(g);
  EXPECT_THAT(text, HasSubstr("job_id=\"job\",owner_uid=\"1000\",rank=\"0\""));
  EXPECT_THAT(text, Not(HasSubstr("rank=\"1\"")));
  EXPECT_THAT(text, HasSubstr(Completed("job", "1000") + "1\n"));
  EXPECT_EQ(jobs_->Held().ranks, 1u);
  // Used after the generation began (it attached after `g` was read): kept.
  const uint64_t generation = jobs_->NextGeneration();
  Complete(spec);
  jobs_->Retire(NodeGauges{}, generation);
  EXPECT_EQ(jobs_->Held().jobs, 1u);
  // Not attached and not used since: gone, lookups and slot with it.
  Scrape(NodeGauges{});
  text = Text();
  EXPECT_THAT(text, Not(HasSubstr("job_id")));
  const MetricsHeld held = jobs_->Held();
  EXPECT_EQ(held.jobs, 0u);
  EXPECT_EQ(held.ranks, 0u);
  EXPECT_EQ(held.cached, 0u);
}

TEST_F(JobMetricsTest, AnOverflowThatNoAttachedJobUsesGoes) {
  Make(/*max_jobs_per_uid=*/1);
  Complete(Spec(1, 1000, "own"));
  Complete(Spec(2, 1000, "folded"));
  NodeGauges g;
  g.jobs = {Attached("own", 1000)};
  g.group_ids = {1};
  Scrape(g);
  const MetricsHeld held = jobs_->Held();
  EXPECT_EQ(held.jobs, 1u);
  EXPECT_EQ(held.overflows, 0u);
  EXPECT_THAT(Text(g), Not(HasSubstr("_other")));
}

TEST_F(JobMetricsTest, RanksPastTheCapShareRankOther) {
  Make(32);
  const GroupSpec spec = Spec(9, 1000, "wide");
  for (int r = 0; r < static_cast<int>(Metrics::kMaxRanksPerJob) + 2; r += 2) {
    Match(spec, r, r + 1);
  }
  // kMaxRanksPerJob of their own, and the later ranks' shared one.
  EXPECT_EQ(jobs_->Held().ranks, Metrics::kMaxRanksPerJob + 1);
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("job_id=\"wide\",owner_uid=\"1000\",rank=\"_other\""));
  EXPECT_THAT(text, Not(HasSubstr("rank=\"" + std::to_string(Metrics::kMaxRanksPerJob) + "\"")));
}

TEST_F(JobMetricsTest, AnOverflowHasNoRankSeries) {
  Make(/*max_jobs_per_uid=*/1);
  Complete(Spec(1, 1000, "own"));
  Match(Spec(2, 1000, "folded"), 0, 1);
  EXPECT_EQ(jobs_->Held().ranks, 0u);
  EXPECT_THAT(Text(), Not(HasSubstr("job_id=\"_other\",owner_uid=\"1000\",rank=")));
}

TEST_F(JobMetricsTest, GaugesSumTheJobsThatShareALabelSet) {
  Make(/*max_jobs_per_uid=*/1);
  NodeGauges g;
  for (int j = 0; j < 3; ++j) {
    NodeGauges::Job job = Attached("j" + std::to_string(j), 1000);
    job.ops_in_flight = 1 + j;
    job.ring_occupancy = 0.1 * (1 + j);
    job.priority_class = "batch";
    job.priority_level = 6;
    g.jobs.push_back(job);
  }
  const std::string text = Text(g);
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_in_flight{job_id=\"j0\",owner_uid=\"1000\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("hsdpd_ops_in_flight{job_id=\"_other\",owner_uid=\"1000\"} 5\n"));
  EXPECT_THAT(text,
              HasSubstr("hsdpd_ring_occupancy_ratio{job_id=\"_other\",owner_uid=\"1000\"} 0.3\n"));
  // The class is per job: a shared label set has none.
  EXPECT_THAT(text, HasSubstr("hsdpd_job_priority_level{job_id=\"j0\",owner_uid=\"1000\","
                              "priority_class=\"batch\"} 6\n"));
  EXPECT_THAT(text, Not(HasSubstr("hsdpd_job_priority_level{job_id=\"_other\"")));
}

}  // namespace
}  // namespace hsdp
