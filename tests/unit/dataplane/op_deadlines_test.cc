// OpDeadlines at explicit times (no clock): what is past the timeout is
// strictly older than it; partially matched operations and complete ones of
// an epoch not started expire, complete ones of the current epoch never do;
// a sequence number nobody submitted fails only once operations of the
// current epoch waited behind it too long.
#include "daemon/dataplane/op_deadlines.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Key = OpMatcher::Key;

constexpr int64_t kTimeout = 1'000;

Arrival Sub(uint32_t epoch, uint64_t seq, int64_t first_ns) {
  Arrival a;
  a.epoch = epoch;
  a.seq = seq;
  a.first_ns = first_ns;
  return a;
}

// Local member `li`'s submission of (epoch, seq), first seen at `first_ns`.
void Add(OpMatcher& m, int li, uint32_t epoch, uint64_t seq, int64_t first_ns) {
  Arrival a = Sub(epoch, seq, first_ns);
  ASSERT_NE(m.Add(li, a), OpMatcher::Added::kDuplicate);
}

TEST(OpDeadlinesTest, PastTheTimeoutMeansStrictlyLongerAgo) {
  const OpDeadlines d(kTimeout);
  EXPECT_FALSE(d.Expired(5'000, 5'000));
  EXPECT_FALSE(d.Expired(5'000, 5'000 + kTimeout));
  EXPECT_TRUE(d.Expired(5'000, 5'000 + kTimeout + 1));
  EXPECT_FALSE(d.Expired(5'000, 4'000)) << "something from the future is not late";
}

TEST(OpDeadlinesTest, NamesTheTimeoutInMilliseconds) {
  EXPECT_EQ(OpDeadlines(60'000'000'000).timeout_ms(), 60'000);
  EXPECT_EQ(OpDeadlines(1'999'999).timeout_ms(), 1);
  EXPECT_EQ(OpDeadlines(60'000'000'000).timeout_ns(), 60'000'000'000);
}

TEST(OpDeadlinesTest, PartiallyMatchedOperationsExpireByTheirFirstSubmission) {
  OpMatcher m(/*group_id=*/1, /*local_members=*/2, /*max_pending=*/16, /*epoch=*/1);
  Add(m, 0, 1, 1, 100);   // waits for member 1 since 100
  Add(m, 1, 1, 2, 600);   // ... since 600
  Add(m, 0, 1, 2, 50);    // the earlier first submission counts
  Add(m, 1, 1, 3, 900);
  const OpDeadlines d(kTimeout);
  EXPECT_THAT(d.ExpiredOps(m, 1'100), IsEmpty());
  EXPECT_THAT(d.ExpiredOps(m, 1'101), ElementsAre(Key{1, 1}));
  EXPECT_THAT(d.ExpiredOps(m, 1'901), ElementsAre(Key{1, 1}, Key{1, 3}));
}

TEST(OpDeadlinesTest, CompleteOperationsOfTheCurrentEpochNeverExpire) {
  OpMatcher m(1, 2, 16, 1);
  Add(m, 0, 1, 2, 0);
  Add(m, 1, 1, 2, 0);  // complete, waits for seq 1 to run first
  const OpDeadlines d(kTimeout);
  EXPECT_THAT(d.ExpiredOps(m, 1'000'000), IsEmpty());
}

TEST(OpDeadlinesTest, CompleteOperationsQueuedForTheNextEpochExpire) {
  OpMatcher m(1, 2, 16, 1);
  Add(m, 0, 2, 1, 0);
  Add(m, 1, 2, 1, 0);  // complete, but epoch 2 has not started
  const OpDeadlines d(kTimeout);
  EXPECT_THAT(d.ExpiredOps(m, kTimeout), IsEmpty());
  EXPECT_THAT(d.ExpiredOps(m, kTimeout + 1), ElementsAre(Key{2, 1}));
  m.StartEpoch(2);  // now it is the current epoch's, waiting for its turn
  EXPECT_THAT(d.ExpiredOps(m, kTimeout + 1), IsEmpty());
}

TEST(OpDeadlinesTest, ANumberNobodySubmittedFailsOnceOthersWaitedTooLong) {
  OpMatcher m(1, 2, 16, 1);
  const OpDeadlines d(kTimeout);
  EXPECT_FALSE(d.NextNeverSubmitted(m, 1'000'000)) << "nothing waits";
  Add(m, 0, 1, 3, 400);
  Add(m, 1, 1, 3, 400);
  Add(m, 0, 1, 2, 200);  // the oldest of the current epoch's
  EXPECT_FALSE(d.NextNeverSubmitted(m, 200 + kTimeout));
  EXPECT_TRUE(d.NextNeverSubmitted(m, 201 + kTimeout));

  // Once seq 1 is submitted (or failed) nothing is missing.
  Add(m, 0, 1, 1, 5'000);
  EXPECT_FALSE(d.NextNeverSubmitted(m, 1'000'000));
}

TEST(OpDeadlinesTest, OnlyTheNextEpochWaitingHoldsNothingUp) {
  OpMatcher m(1, 2, 16, 1);
  Add(m, 0, 2, 5, 0);  // the next epoch's: seq 1 of the current one blocks nothing
  const OpDeadlines d(kTimeout);
  EXPECT_FALSE(d.NextNeverSubmitted(m, 1'000'000));
}

TEST(OpDeadlinesTest, AFailedNextNumberIsNotMissing) {
  OpMatcher m(1, 2, 16, 1);
  Add(m, 0, 1, 2, 0);
  m.Fail({1, 1}, absl::AbortedError("rejected"));
  const OpDeadlines d(kTimeout);
  EXPECT_FALSE(d.NextNeverSubmitted(m, 1'000'000));
}

}  // namespace
}  // namespace hsdp
