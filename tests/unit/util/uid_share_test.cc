// UidSharedPool: the node's total and each non-root uid's share are both
// enforced, atomically, and what a uid gives back is what it took.
#include "daemon/util/uid_share.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

TEST(UidShareTest, ShareIsAPercentOfTheTotalAndNeverZero) {
  EXPECT_EQ(UidShareOf(16, 50), 8u);
  EXPECT_EQ(UidShareOf(16, 100), 16u);
  EXPECT_EQ(UidShareOf(3, 1), 1u);  // a small pool stays usable
  EXPECT_EQ(UidShareOf(0, 50), 0u);
  EXPECT_EQ(UidShareOf(UINT64_MAX, 100), UINT64_MAX);  // no overflow
  EXPECT_EQ(UidShareOf(UINT64_MAX, 50), UINT64_MAX / 100 * 50 + UINT64_MAX % 100 * 50 / 100);
}

TEST(UidShareTest, OneUidCannotTakeMoreThanItsShare) {
  UidSharedPool pool("placement waits", "waits", 16, 25);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pool.Take(1000, 1).ok());
  const absl::Status over = pool.Take(1000, 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("uid 1000 already holds 4 of its share of 4 waits"));
  EXPECT_THAT(over.message(), HasSubstr("limits.uid_share_percent"));
  // Another uid is not held up by the first.
  EXPECT_TRUE(pool.Take(1001, 4).ok());
  EXPECT_EQ(pool.used(), 8u);
  EXPECT_EQ(pool.used_by(1000), 4u);
  pool.Give(1000, 1);
  EXPECT_TRUE(pool.Take(1000, 1).ok());
}

TEST(UidShareTest, RootIsHeldOnlyToTheNodesTotal) {
  UidSharedPool pool("arena memory", "bytes", 100, 10);
  EXPECT_TRUE(pool.Take(0, 90).ok());
  EXPECT_TRUE(pool.Take(1000, 10).ok());
  const absl::Status full = pool.Take(0, 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("this node's arena memory is used up: 100 of 100 bytes"));
}

TEST(UidShareTest, HugeOrRepeatedRequestsNeverWrap) {
  UidSharedPool pool("sessions", "sessions", 10, 100);
  EXPECT_FALSE(pool.Take(5, UINT64_MAX).ok());
  EXPECT_TRUE(pool.Take(5, 10).ok());
  EXPECT_FALSE(pool.Take(5, UINT64_MAX - 5).ok());
  // Giving back more than was taken, or for a uid that holds nothing, changes nothing else.
  pool.Give(6, 3);
  EXPECT_EQ(pool.used(), 10u);
  pool.Give(5, 100);
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.used_by(5), 0u);
}

TEST(UidShareTest, ConcurrentTakersNeverExceedTheShareOrTheTotal) {
  UidSharedPool pool("arena memory", "bytes", 1000, 30);
  std::atomic<uint64_t> granted[3] = {0, 0, 0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const uint32_t uid = 1000 + t % 3;
      for (int i = 0; i < 200; ++i) {
        if (pool.Take(uid, 7).ok()) granted[t % 3] += 7;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int u = 0; u < 3; ++u) {
    EXPECT_LE(granted[u].load(), 300u);
    EXPECT_GT(granted[u].load(), 300u - 7);  // each filled its share
    EXPECT_EQ(pool.used_by(1000 + u), granted[u].load());
  }
  EXPECT_EQ(pool.used(), granted[0] + granted[1] + granted[2]);
}

}  // namespace
}  // namespace hsdp
