// PlacementWaits: bounded, a share per uid (root only to the total), and a
// place is given back exactly once, when its slot leaves or goes.
#include "daemon/jobs/placement_waits.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PlacementWaitsTest, EachUidWaitsWithinItsShare) {
  PlacementWaits waits(/*uid_share_percent=*/25);  // 16 waits, 4 per uid
  std::vector<PlacementWaits::Slot> held;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<PlacementWaits::Slot> s = waits.Enter(1000);
    ASSERT_TRUE(s.ok()) << s.status();
    held.push_back(*std::move(s));
  }
  absl::StatusOr<PlacementWaits::Slot> over = waits.Enter(1000);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              AllOf(HasSubstr("ranks: too many NewGroup calls"), HasSubstr("uid 1000"),
                    HasSubstr("limits.uid_share_percent"), HasSubstr("retry")));
  EXPECT_TRUE(waits.Enter(1001).ok()) << "another uid is not held up";
  EXPECT_EQ(waits.waiting(), 4u);  // the temporary slot left when it went
  held.pop_back();
  EXPECT_EQ(waits.waiting_of(1000), 3u);
  EXPECT_TRUE(waits.Enter(1000).ok());
}

TEST(PlacementWaitsTest, TheTotalBoundsRootToo) {
  PlacementWaits waits(100, /*max=*/2);
  absl::StatusOr<PlacementWaits::Slot> a = waits.Enter(0);
  absl::StatusOr<PlacementWaits::Slot> b = waits.Enter(0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(waits.Enter(0).status().code(), absl::StatusCode::kResourceExhausted);
  a->Leave();
  a->Leave();  // idempotent: given back once
  EXPECT_EQ(waits.waiting(), 1u);
  PlacementWaits::Slot moved = *std::move(b);
  EXPECT_EQ(waits.waiting(), 1u) << "a move hands the place over";
  moved = *waits.Enter(7);  // the place it held goes, the new one stays
  EXPECT_EQ(waits.waiting(), 1u);
  EXPECT_EQ(waits.waiting_of(7), 1u);
}

}  // namespace
}  // namespace hsdp
