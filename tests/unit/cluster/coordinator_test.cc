// Coordinator membership: rank assignment, rejoin, conflicts, loss by
// missed heartbeats and the epoch.
#include "daemon/cluster/coordinator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

v1::JoinRequest Req(const std::string& address, const std::string& instance, int rank = -1,
                    uint32_t nodes = 3) {
  v1::JoinRequest r;
  r.set_address(address);
  r.set_data_address("127.0.0.1");
  r.set_name(address);
  r.set_instance(instance);
  r.set_requested_rank(rank);
  r.set_nodes(nodes);
  return r;
}

Coordinator::Options Opts() {
  return {.self_address = "c:1", .nodes = 3, .heartbeat_ms = 100, .missed_heartbeats = 3};
}

TEST(CoordinatorTest, RanksByJoinOrderWithZeroForTheCoordinator) {
  Coordinator c(Opts());
  auto a = c.Join(Req("a:1", "ia"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->node_rank(), 1);
  EXPECT_EQ(a->epoch(), 1u);
  auto self = c.Join(Req("c:1", "ic"));
  ASSERT_TRUE(self.ok());
  EXPECT_EQ(self->node_rank(), 0);
  auto b = c.Join(Req("b:1", "ib"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->node_rank(), 2);
  EXPECT_EQ(b->epoch(), 3u);
  EXPECT_EQ(b->nodes_size(), 3);
  auto full = c.Join(Req("d:1", "id"));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  // The same instance joining again changes nothing.
  auto again = c.Join(Req("a:1", "ia"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->node_rank(), 1);
  EXPECT_EQ(again->epoch(), 3u);
}

TEST(CoordinatorTest, ConflictsAndMismatches) {
  Coordinator c(Opts());
  ASSERT_TRUE(c.Join(Req("a:1", "ia", 2)).ok());
  EXPECT_EQ(c.Join(Req("b:1", "ib", 2)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(c.Join(Req("a:1", "ia", 1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Join(Req("b:1", "ib", -1, 4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Join(Req("b:1", "ib", 3)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Join(Req("", "ib")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Join(Req("b:1", "ib", 0)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Join(Req("c:1", "ic", 0))->node_rank(), 0);
}

TEST(CoordinatorTest, SilentNodeIsLostAndRejoinsWithItsRank) {
  Coordinator c(Opts());
  ASSERT_TRUE(c.Join(Req("c:1", "ic")).ok());
  ASSERT_TRUE(c.Join(Req("a:1", "ia")).ok());
  const uint64_t before = c.epoch();
  v1::HeartbeatRequest hb;
  hb.set_node_rank(0);
  hb.set_instance("ic");
  c.CheckLiveness(absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(c.epoch(), before);
  // 0 keeps heartbeating; 1 is silent past 3 x 100 ms.
  ASSERT_TRUE(c.Heartbeat(hb).ok());
  absl::SleepFor(absl::Milliseconds(350));
  ASSERT_TRUE(c.Heartbeat(hb).ok());
  c.CheckLiveness(absl::Now());
  EXPECT_EQ(c.epoch(), before + 1);
  auto view = c.Heartbeat(hb);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->nodes(1).state(), "lost");
  EXPECT_EQ(view->nodes(0).state(), "alive");
  v1::HeartbeatRequest lost;
  lost.set_node_rank(1);
  lost.set_instance("ia");
  EXPECT_EQ(c.Heartbeat(lost).status().code(), absl::StatusCode::kFailedPrecondition);
  auto back = c.Join(Req("a:1", "ia2"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->node_rank(), 1);
  EXPECT_EQ(back->epoch(), before + 2);
}

TEST(CoordinatorTest, RestartedCoordinatorContinuesTheEpoch) {
  Coordinator c(Opts());
  v1::JoinRequest r = Req("a:1", "ia");
  r.set_last_epoch(17);
  auto a = c.Join(r);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->epoch(), 18u);
}

}  // namespace
}  // namespace hsdp
