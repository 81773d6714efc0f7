// RetiredGroups on a FakeClock: a key is kept exactly until its linger has
// passed, keys go in retirement order, and a full list refuses (the caller
// destroys at once).
#include "daemon/jobs/retired_groups.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kMs = 1'000'000;

TEST(RetiredGroupsTest, AKeyIsDueExactlyWhenItsLingerHasPassed) {
  FakeClock clock;
  RetiredGroups retired(2500 * kMs, &clock);
  ASSERT_TRUE(retired.Retire("g1"));
  clock.Advance(1000 * kMs);
  ASSERT_TRUE(retired.Retire("g2"));
  EXPECT_EQ(retired.size(), 2u);
  clock.Advance(1500 * kMs - 1);
  EXPECT_THAT(retired.TakeDue(), IsEmpty());
  clock.Advance(1);
  EXPECT_THAT(retired.TakeDue(), ElementsAre("g1"));
  EXPECT_EQ(retired.size(), 1u);
  clock.Advance(999 * kMs);
  EXPECT_THAT(retired.TakeDue(), IsEmpty());
  clock.Advance(1 * kMs);
  EXPECT_THAT(retired.TakeDue(), ElementsAre("g2"));
  EXPECT_EQ(retired.size(), 0u);
  EXPECT_THAT(retired.TakeDue(), IsEmpty());
}

TEST(RetiredGroupsTest, KeysRetiredTogetherGoTogetherInOrder) {
  FakeClock clock;
  RetiredGroups retired(10 * kMs, &clock);
  for (const char* key : {"a", "a/p2p/0-1", "b"}) ASSERT_TRUE(retired.Retire(key));
  clock.Advance(60'000 * kMs);  // long after: all due at once
  EXPECT_THAT(retired.TakeDue(), ElementsAre("a", "a/p2p/0-1", "b"));
}

TEST(RetiredGroupsTest, AFullListRefusesUntilSomeGo) {
  FakeClock clock;
  RetiredGroups retired(5 * kMs, &clock, /*capacity=*/2);
  ASSERT_TRUE(retired.Retire("a"));
  ASSERT_TRUE(retired.Retire("b"));
  EXPECT_FALSE(retired.Retire("c"));
  EXPECT_EQ(retired.size(), 2u);
  clock.Advance(5 * kMs);
  EXPECT_THAT(retired.TakeDue(), ElementsAre("a", "b"));
  EXPECT_TRUE(retired.Retire("c"));
}

TEST(RetiredGroupsTest, TheRealClockIsTheDefault) {
  RetiredGroups retired(0);
  EXPECT_EQ(retired.linger_ns(), 0);
  EXPECT_EQ(RetiredGroups::kMaxRetiredGroups, 16384u);
  ASSERT_TRUE(retired.Retire("now"));
  EXPECT_THAT(retired.TakeDue(), ElementsAre("now"));  // a linger of 0 is due at once
}

}  // namespace
}  // namespace hsdp
