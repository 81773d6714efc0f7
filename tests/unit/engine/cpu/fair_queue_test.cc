// FairQueue: the order in which the CPU engine serves several jobs' work —
// classes strictly by priority, jobs of a class by bytes served (start-time
// fair queueing), a job's own work by op priority then arrival.
#include "daemon/engine/cpu/fair_queue.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hsdp::cpu {
namespace {

using Entry = FairQueue::Entry;

Entry E(const std::string& job, uint64_t order, int priority = 1, int qos_class = 1) {
  return Entry{qos_class, job, priority, order};
}

// Serves the queue to the end, charging `bytes_of(order)` per pop and
// putting an entry back `slices_of(order) - 1` times (a sliced task).
template <typename Bytes, typename Slices>
std::vector<uint64_t> Drain(FairQueue& q, Bytes bytes_of, Slices slices_of) {
  std::vector<uint64_t> served;
  std::map<uint64_t, int> left;
  while (auto e = q.Pop()) {
    served.push_back(e->order);
    if (!left.count(e->order)) left[e->order] = slices_of(e->order);
    q.Charge(e->qos_class, e->job, bytes_of(e->order));
    if (--left[e->order] > 0) q.Push(*e);
  }
  return served;
}

TEST(FairQueueTest, OneJobKeepsPriorityThenArrivalOrder) {
  FairQueue q;
  q.Push(E("a", 1, /*priority=*/1));
  q.Push(E("a", 2, 0));
  q.Push(E("a", 3, 1));
  q.Push(E("a", 4, 0));
  auto order = Drain(
      q, [](uint64_t) { return 100; }, [](uint64_t) { return 1; });
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 4, 1, 3}));
  EXPECT_TRUE(q.empty());
}

TEST(FairQueueTest, TwoJobsShareByBytesNotByHowMuchTheyQueue) {
  FairQueue q;
  // Job a queues eight operations before b queues two of the same size.
  for (uint64_t i = 1; i <= 8; ++i) q.Push(E("a", i));
  q.Push(E("b", 9));
  q.Push(E("b", 10));
  auto order = Drain(
      q, [](uint64_t) { return 1000; }, [](uint64_t) { return 1; });
  // b's two run among a's first three, not after all eight.
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 9, 2, 10, 3, 4, 5, 6, 7, 8}));
}

TEST(FairQueueTest, ASlicedLargeOperationLetsAnotherJobsSmallOneThroughAfterOneSlice) {
  FairQueue q;
  q.Push(E("big", 1));
  auto first = q.Pop();  // the big one's first slice starts
  ASSERT_TRUE(first);
  q.Push(E("small", 2));  // arrives while it runs
  q.Charge(1, "big", 4 << 20);
  q.Push(*first);  // back after its slice
  auto next = q.Pop();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->order, 2u) << "the small job goes before the big one's second slice";
}

TEST(FairQueueTest, BytesNotOperationsAreShared) {
  FairQueue q;
  // a's operations are 4x the size of b's: b gets about four for each of a's.
  for (uint64_t i = 1; i <= 3; ++i) q.Push(E("a", i));
  for (uint64_t i = 11; i <= 22; ++i) q.Push(E("b", i));
  auto order = Drain(
      q, [](uint64_t o) { return o < 10 ? 4000 : 1000; }, [](uint64_t) { return 1; });
  // Count b's served before a's second and third.
  auto pos = [&](uint64_t o) { return std::find(order.begin(), order.end(), o) - order.begin(); };
  const long b_before_a2 =
      std::count_if(order.begin(), order.begin() + pos(2), [](uint64_t o) { return o > 10; });
  const long b_before_a3 =
      std::count_if(order.begin(), order.begin() + pos(3), [](uint64_t o) { return o > 10; });
  EXPECT_EQ(b_before_a2, 4);
  EXPECT_EQ(b_before_a3, 8);
}

TEST(FairQueueTest, AHigherClassGoesFirstWheneverItHasWork) {
  FairQueue q;
  q.Push(E("batch", 1, 1, /*qos_class=*/2));
  q.Push(E("batch", 2, 1, 2));
  q.Push(E("normal", 3, 1, 1));
  q.Push(E("urgent", 4, 1, 0));
  auto order = Drain(
      q, [](uint64_t) { return 1; }, [](uint64_t) { return 1; });
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 3, 1, 2}));
}

TEST(FairQueueTest, IdlingEarnsNoCredit) {
  FairQueue q;
  // a is served alone for a long time; b arrives later and must not then
  // have a's whole history as credit (b would run alone for that long).
  for (uint64_t i = 1; i <= 20; ++i) {
    q.Push(E("a", i));
    ASSERT_TRUE(q.Pop());
    q.Charge(1, "a", 1000);
  }
  for (uint64_t i = 21; i <= 24; ++i) q.Push(E("a", i));
  for (uint64_t i = 31; i <= 34; ++i) q.Push(E("b", i));
  auto order = Drain(
      q, [](uint64_t) { return 1000; }, [](uint64_t) { return 1; });
  // b starts at the start time of a's last operation (one ahead), then they
  // alternate.
  EXPECT_EQ(order, (std::vector<uint64_t>{31, 21, 32, 22, 33, 23, 34, 24}));
}

TEST(FairQueueTest, IdleJobsAreForgottenWithinTheBound) {
  FairQueue q;
  for (uint64_t i = 0; i < 5000; ++i) {
    const std::string job = "job" + std::to_string(i);
    q.Push(E(job, i));
    auto e = q.Pop();
    ASSERT_TRUE(e);
    q.Charge(1, job, 10);
  }
  EXPECT_LE(q.jobs_tracked(), 2 * FairQueue::kMaxIdleJobs + 1);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace hsdp::cpu
