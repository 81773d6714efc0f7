// StragglerStats: totals, percentiles, the bounded recent list, ordering and
// per-uid visibility.
#include "daemon/observability/straggler_stats.h"

#include "gtest/gtest.h"

namespace hsdp {
namespace {

StragglerEvent Ev(uint64_t seq) {
  StragglerEvent e;
  e.group_id = 1;
  e.op = "all_reduce";
  e.seq = seq;
  e.epoch = 1;
  return e;
}

TEST(StragglerStatsTest, BucketsBoundTheirValues) {
  for (int64_t ns : {1LL, 2LL, 3LL, 999LL, 1000LL, 41'000'000LL, 5'000'000'000LL}) {
    const int b = StragglerStats::BucketOf(ns);
    EXPECT_GE(StragglerStats::BucketUpperNs(b), ns) << ns;
    EXPECT_LE(StragglerStats::BucketUpperNs(b), ns * 1.2 + 1) << ns;
  }
  EXPECT_EQ(StragglerStats::BucketOf(0), 0);
}

TEST(StragglerStatsTest, RanksOrderedByTotalWaitWithPercentiles) {
  StragglerStats s;
  for (int i = 1; i <= 100; ++i) s.Record("job", 1000, 3, i * 1'000'000LL, Ev(i));  // 1..100 ms
  s.Record("job", 1000, 1, 500'000'000, Ev(101));
  s.Record("job", 1000, 2, -1, Ev(102));  // one member only: counts as matched
  const auto report = s.Report("", std::nullopt);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].ops_matched, 102u);
  ASSERT_EQ(report[0].ranks.size(), 2u);
  const StragglerRankReport& r3 = report[0].ranks[0];
  EXPECT_EQ(r3.rank, 3);  // 5.05 s total beats rank 1's 0.5 s
  EXPECT_EQ(r3.times_last, 100u);
  EXPECT_EQ(r3.waited_ns_total, uint64_t{5050} * 1'000'000);
  EXPECT_EQ(r3.max_ns, 100'000'000);
  EXPECT_NEAR(r3.p50_ns / 1e6, 50, 50 * 0.2);
  EXPECT_NEAR(r3.p90_ns / 1e6, 90, 90 * 0.2);
  EXPECT_GE(r3.p99_ns, 99'000'000);
  EXPECT_LE(r3.p99_ns, r3.max_ns);
  ASSERT_EQ(r3.recent.size(), StragglerStats::kRecent);
  EXPECT_EQ(r3.recent.back().seq, 100u);
  EXPECT_EQ(r3.recent.back().waited_ns, 100'000'000);
  EXPECT_EQ(r3.recent.front().seq, 100u - StragglerStats::kRecent + 1);
  EXPECT_LT(r3.recent.front().event_id, r3.recent.back().event_id);
  EXPECT_EQ(report[0].ranks[1].rank, 1);
  EXPECT_EQ(report[0].ranks[1].p50_ns, 500'000'000);  // capped at the max seen
}

TEST(StragglerStatsTest, FiltersByJobAndUid) {
  StragglerStats s;
  s.Record("alice", 1000, 0, 10, Ev(1));
  s.Record("bob", 1001, 1, 10, Ev(1));
  EXPECT_EQ(s.Report("", std::nullopt).size(), 2u);
  const auto alice = s.Report("", 1000u);
  ASSERT_EQ(alice.size(), 1u);
  EXPECT_EQ(alice[0].job_id, "alice");
  EXPECT_TRUE(s.Report("bob", 1000u).empty());
  EXPECT_EQ(s.Report("bob", std::nullopt).size(), 1u);
}

// A job is its owner plus its name: two uids' "train" are kept apart, each
// shown only to its owner, and neither's last record changes who sees what.
TEST(StragglerStatsTest, SameNamedJobsOfTwoUidsNeverMix) {
  StragglerStats s;
  s.Record("train", 1000, 0, 10, Ev(1));
  s.Record("train", 1001, 1, 99, Ev(1));
  s.Record("train", 1001, 1, 99, Ev(2));
  const auto alice = s.Report("train", 1000u);
  ASSERT_EQ(alice.size(), 1u);
  EXPECT_EQ(alice[0].owner_uid, 1000u);
  EXPECT_EQ(alice[0].ops_matched, 1u);
  ASSERT_EQ(alice[0].ranks.size(), 1u);
  EXPECT_EQ(alice[0].ranks[0].rank, 0);
  const auto bob = s.Report("train", 1001u);
  ASSERT_EQ(bob.size(), 1u);
  EXPECT_EQ(bob[0].ops_matched, 2u);
  EXPECT_EQ(bob[0].ranks[0].rank, 1);
  EXPECT_EQ(s.Report("train", std::nullopt).size(), 2u) << "root sees both, apart";
}

TEST(StragglerStatsTest, JobCountIsBounded) {
  StragglerStats s;
  for (size_t i = 0; i < StragglerStats::kMaxJobs + 10; ++i) {
    s.Record("job" + std::to_string(i), 0, 0, 5, Ev(1));
  }
  const auto all = s.Report("", std::nullopt);
  EXPECT_EQ(all.size(), StragglerStats::kMaxJobs);
  EXPECT_TRUE(s.Report("job0", std::nullopt).empty());  // the least recently active went
  EXPECT_EQ(s.Report("job" + std::to_string(StragglerStats::kMaxJobs + 9), std::nullopt).size(),
            1u);
}

}  // namespace
}  // namespace hsdp
