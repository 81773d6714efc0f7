// OpMatcher on its own: the sequence window and the queue bound, matching
// the local members' submissions, taking the next operation out in sequence
// order, failures remembered for late submissions, and a leaving member's
// queued submissions.
#include "daemon/dataplane/op_matcher.h"

#include <string>

#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing::MakeSession;

constexpr uint32_t kGroup = 7;
constexpr int kLocal = 2;
constexpr uint32_t kMaxPending = 4;

// A submission of (epoch, seq) that entered the daemon at `first_ns`.
Arrival Sub(uint32_t epoch, uint64_t seq, int64_t first_ns = 0, uint64_t op_id = 0) {
  Arrival a;
  a.epoch = epoch;
  a.seq = seq;
  a.first_ns = first_ns;
  a.desc.op_id = op_id;
  return a;
}

// Both local members' submissions of (epoch, seq).
void AddBoth(OpMatcher& m, uint32_t epoch, uint64_t seq) {
  Arrival a = Sub(epoch, seq), b = Sub(epoch, seq);
  ASSERT_EQ(m.Add(0, a), OpMatcher::Added::kWaiting);
  ASSERT_EQ(m.Add(1, b), OpMatcher::Added::kAllArrived);
}

TEST(OpMatcherTest, ReadyOnlyWhenEveryLocalMemberArrived) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  Arrival a = Sub(1, 1, 500, 11);
  const PendingOp* op = nullptr;
  EXPECT_EQ(m.Add(1, a, &op), OpMatcher::Added::kWaiting);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->arrived, 1);
  EXPECT_FALSE(m.TakeReady().has_value());
  EXPECT_EQ(m.size(), 1u);

  Arrival b = Sub(1, 1, 300, 10);
  EXPECT_EQ(m.Add(0, b, &op), OpMatcher::Added::kAllArrived);
  EXPECT_EQ(op->first_ns, 300);  // the earliest of the two

  std::optional<PendingOp> ready = m.TakeReady();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->epoch, 1u);
  EXPECT_EQ(ready->seq, 1u);
  EXPECT_EQ(ready->arrived, 2);
  ASSERT_EQ(ready->arrivals.size(), 2u);
  EXPECT_EQ(ready->arrivals.at(0).desc.op_id, 10u);  // by local index
  EXPECT_EQ(ready->arrivals.at(1).desc.op_id, 11u);
  EXPECT_EQ(m.next_seq(), 2u);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_FALSE(m.TakeReady().has_value());
}

TEST(OpMatcherTest, TakesOperationsOutInSequenceOrderOnly) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  AddBoth(m, 1, 2);
  EXPECT_FALSE(m.TakeReady().has_value()) << "seq 2 waits for seq 1";
  AddBoth(m, 1, 1);
  auto first = m.TakeReady();
  auto second = m.TakeReady();
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(first->seq, 1u);
  EXPECT_EQ(second->seq, 2u);
  EXPECT_EQ(m.next_seq(), 3u);
}

TEST(OpMatcherTest, RefusesAMembersSecondSubmissionOfAnOperation) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  Arrival a = Sub(1, 1, 0, 1), again = Sub(1, 1, 0, 2);
  EXPECT_EQ(m.Add(0, a), OpMatcher::Added::kWaiting);
  EXPECT_EQ(m.Add(0, again), OpMatcher::Added::kDuplicate);
  EXPECT_EQ(again.desc.op_id, 2u) << "a refused submission stays with the caller";
  EXPECT_EQ(m.Find({1, 1})->arrived, 1);
  EXPECT_EQ(m.Find({1, 1})->arrivals.at(0).desc.op_id, 1u);
}

TEST(OpMatcherTest, ARejectedSubmissionIsStoredButNotCounted) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  Arrival bad = Sub(1, 1, 0, 5);
  bad.rejected = absl::InvalidArgumentError("count: too big");
  const PendingOp* op = nullptr;
  EXPECT_EQ(m.Add(0, bad, &op), OpMatcher::Added::kRejected);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->arrived, 0);
  ASSERT_EQ(op->arrivals.count(0), 1u);
  EXPECT_EQ(op->arrivals.at(0).desc.op_id, 5u);
}

TEST(OpMatcherTest, ChecksTheSequenceWindow) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  EXPECT_THAT(std::string(m.Check(1, 0).message()), HasSubstr("seq: 0 in group 7 already ran"));
  EXPECT_TRUE(m.Check(1, 1).ok());
  EXPECT_TRUE(m.Check(1, 1 + kMaxPending).ok());
  const absl::Status ahead = m.Check(1, 2 + kMaxPending);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ahead.message()),
              HasSubstr("seq: 6 in group 7 is more than 4 operations ahead"));
  EXPECT_TRUE(m.InWindow(1, 1));
  EXPECT_TRUE(m.InWindow(1, 5));
  EXPECT_FALSE(m.InWindow(1, 6));
  EXPECT_FALSE(m.InWindow(2, 1)) << "only the current epoch has a runnable window";

  // After seq 1 ran, it is behind the window, and the window moved on.
  AddBoth(m, 1, 1);
  ASSERT_TRUE(m.TakeReady().has_value());
  const absl::Status ran = m.Check(1, 1);
  EXPECT_EQ(ran.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ran.message(), "seq: 1 in group 7 already ran (next is 2)");
  EXPECT_TRUE(m.Check(1, 6).ok());
  EXPECT_FALSE(m.InWindow(1, 1));
  // The next epoch's window counts from 1, whatever ran in this one.
  EXPECT_TRUE(m.Check(2, 1).ok());
  EXPECT_TRUE(m.Check(2, 1 + kMaxPending).ok());
  EXPECT_FALSE(m.Check(2, 2 + kMaxPending).ok());
}

TEST(OpMatcherTest, BoundsTheOperationsWaiting) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  for (uint64_t seq = 1; seq <= kMaxPending; ++seq) {
    ASSERT_TRUE(m.Check(1, seq).ok());
    Arrival a = Sub(1, seq);
    m.Add(0, a);
  }
  EXPECT_EQ(m.size(), kMaxPending);
  const absl::Status full = m.Check(2, 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("group 7 already has 4 operations waiting for members"));
  EXPECT_TRUE(m.Check(1, 3).ok()) << "a submission to a waiting operation is always taken";
}

TEST(OpMatcherTest, AFailedSequenceNumberGivesLateSubmissionsTheSameAnswer) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  Arrival a = Sub(1, 2, 0, 21);
  m.Add(0, a);
  const absl::Status why = absl::DeadlineExceededError("timed out waiting for rank 11");
  std::vector<Arrival> failed = m.Fail({1, 2}, why);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].desc.op_id, 21u);
  EXPECT_EQ(m.Find({1, 2}), nullptr);
  EXPECT_EQ(m.Check(1, 2), why);
  // Another epoch's failure is not remembered (its numbers are not this epoch's).
  m.Fail({2, 3}, why);
  EXPECT_TRUE(m.Check(2, 3).ok());
  EXPECT_TRUE(m.Check(1, 3).ok());
}

TEST(OpMatcherTest, TheNextNumberMovesPastFailedOnes) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  m.Fail({1, 1}, absl::AbortedError("x"));
  m.Fail({1, 2}, absl::AbortedError("y"));
  AddBoth(m, 1, 3);
  EXPECT_FALSE(m.TakeReady().has_value());
  m.SkipFailed();
  EXPECT_EQ(m.next_seq(), 3u);
  auto ready = m.TakeReady();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->seq, 3u);
}

TEST(OpMatcherTest, RemembersOnlyTheLatestFailures) {
  OpMatcher m(kGroup, kLocal, 1u << 20, 1);
  const size_t n = OpMatcher::kMaxRememberedFailures + 1;
  for (uint64_t seq = 1; seq <= n; ++seq) m.Fail({1, seq}, absl::AbortedError("gone"));
  EXPECT_TRUE(m.Check(1, 1).ok()) << "the oldest is forgotten";
  EXPECT_EQ(m.Check(1, 2).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(m.Check(1, n).code(), absl::StatusCode::kAborted);
}

TEST(OpMatcherTest, FailsEveryOperationOfAnEpochAndOnlyThose) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  Arrival a = Sub(1, 2, 0, 12), b = Sub(1, 1, 0, 11), c = Sub(1, 1, 0, 13), next = Sub(2, 1, 0, 21);
  m.Add(0, a);
  m.Add(0, b);
  m.Add(1, c);
  m.Add(0, next);
  size_t ops = 0;
  std::vector<Arrival> failed = m.FailEpoch(1, absl::AbortedError("epoch ended"), &ops);
  EXPECT_EQ(ops, 2u);
  std::vector<uint64_t> ids;
  for (const Arrival& f : failed) ids.push_back(f.desc.op_id);
  EXPECT_THAT(ids, ElementsAre(11, 13, 12));  // sequence order, then local index
  EXPECT_EQ(m.size(), 1u);
  EXPECT_NE(m.Find({2, 1}), nullptr);
  EXPECT_EQ(m.Check(1, 1).code(), absl::StatusCode::kAborted);
}

TEST(OpMatcherTest, StartingAnEpochForgetsFailuresAndRestartsTheSequence) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  AddBoth(m, 1, 1);
  ASSERT_TRUE(m.TakeReady().has_value());
  m.Fail({1, 2}, absl::AbortedError("epoch ended"));
  AddBoth(m, 2, 1);  // queued for the next epoch: not runnable yet
  EXPECT_FALSE(m.TakeReady().has_value());

  m.StartEpoch(2);
  EXPECT_EQ(m.epoch(), 2u);
  EXPECT_EQ(m.next_seq(), 1u);
  EXPECT_TRUE(m.Check(2, 2).ok()) << "epoch 1's failure of seq 2 is not epoch 2's";
  auto ready = m.TakeReady();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->epoch, 2u);
  EXPECT_EQ(ready->seq, 1u);
}

TEST(OpMatcherTest, TakesALeavingMembersQueuedSubmissionsOnly) {
  auto leaving = MakeSession(201, 0, 2);
  auto staying = MakeSession(202, 1, 2);
  ASSERT_NE(leaving, nullptr);
  ASSERT_NE(staying, nullptr);
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  auto add = [&](int li, const std::shared_ptr<Session>& s, uint32_t epoch, uint64_t seq,
                 uint64_t op_id) {
    Arrival a = Sub(epoch, seq, 0, op_id);
    a.session = s;
    m.Add(li, a);
  };
  add(0, leaving, 1, 1, 1);   // current epoch: failing the epoch reaches it, not this
  add(0, leaving, 2, 1, 2);   // next epoch, alone: the operation goes
  add(0, leaving, 2, 2, 3);   // next epoch, with the other member's
  add(1, staying, 2, 2, 4);

  std::vector<Arrival> taken = m.TakeQueued(leaving.get());
  std::vector<uint64_t> ids;
  for (const Arrival& a : taken) ids.push_back(a.desc.op_id);
  EXPECT_THAT(ids, ElementsAre(2, 3));
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.Find({2, 1}), nullptr);
  ASSERT_NE(m.Find({1, 1}), nullptr);
  const PendingOp* kept = m.Find({2, 2});
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->arrived, 1);
  EXPECT_THAT(kept->arrivals, ElementsAre(Pair(1, ::testing::_)));
}

TEST(OpMatcherTest, TellsWhenTheNextNumberIsMissingAndSinceWhen) {
  OpMatcher m(kGroup, kLocal, kMaxPending, 1);
  EXPECT_FALSE(m.NextMissing()) << "nothing waits";
  EXPECT_FALSE(m.OldestFirstNs(1).has_value());
  Arrival a = Sub(1, 3, 900), b = Sub(1, 2, 700), c = Sub(2, 1, 100);
  m.Add(0, a);
  m.Add(0, b);
  m.Add(0, c);
  EXPECT_TRUE(m.NextMissing());
  EXPECT_EQ(m.OldestFirstNs(1), 700);
  EXPECT_EQ(m.OldestFirstNs(2), 100);

  m.FailNext(absl::DeadlineExceededError("seq 1 was never submitted"));
  EXPECT_FALSE(m.NextMissing()) << "it failed: nothing to wait for";
  EXPECT_EQ(m.Check(1, 1).code(), absl::StatusCode::kDeadlineExceeded);
  m.SkipFailed();
  EXPECT_EQ(m.next_seq(), 2u);
  EXPECT_FALSE(m.NextMissing()) << "seq 2 has a submission";
}

}  // namespace
}  // namespace hsdp
