// HeartbeatHealth: degraded after missed_heartbeats failures in a row (once),
// healthy again at the first answer, for either store.
#include "daemon/cluster/heartbeat_health.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

TEST(HeartbeatHealthTest, DegradedOnceAfterTheMissedHeartbeatsAndHealthyAtTheFirstAnswer) {
  HeartbeatHealth h("etcd (e:1)", 3, " until etcd has a quorum again");
  const absl::Status down = absl::UnavailableError("no leader");
  EXPECT_FALSE(h.Missed(down).has_value());
  EXPECT_FALSE(h.Missed(down).has_value());
  std::optional<std::string> detail = h.Missed(down);
  ASSERT_TRUE(detail.has_value());
  EXPECT_TRUE(h.degraded());
  EXPECT_EQ(*detail,
            "etcd (e:1) has not answered 3 heartbeats (no leader); membership is frozen, node "
            "losses are not detected, and new cross-node groups and attaches fail until etcd "
            "has a quorum again");
  EXPECT_FALSE(h.Missed(down).has_value());  // said once
  EXPECT_EQ(h.failures(), 4u);
  h.Answered();
  EXPECT_FALSE(h.degraded());
  EXPECT_EQ(h.failures(), 0u);
}

TEST(HeartbeatHealthTest, AnAnswerBeforeTheLimitStartsTheCountAgain) {
  HeartbeatHealth h("the coordinator c:1", 2, "; restart the coordinator");
  EXPECT_FALSE(h.Missed(absl::UnavailableError("x")).has_value());
  h.Answered();
  EXPECT_FALSE(h.Missed(absl::UnavailableError("x")).has_value());
  std::optional<std::string> detail = h.Missed(absl::DeadlineExceededError("slow"));
  ASSERT_TRUE(detail.has_value());
  EXPECT_THAT(*detail, HasSubstr("the coordinator c:1 has not answered 2 heartbeats (slow)"));
  EXPECT_THAT(*detail, HasSubstr("; restart the coordinator"));
}

}  // namespace
}  // namespace hsdp
