// MemberView: a whole list, deltas merged by rank, the PeerEvents they make,
// ages (an alive entry a no-change answer vouched for is as old as that
// answer), entries from the coordinator with ranks out of range, Clear.
#include "daemon/cluster/member_view.h"

#include "gtest/gtest.h"

namespace hsdp {
namespace {

v1::ClusterNode Node(int rank, const std::string& state, double age,
                     const std::string& instance = "i") {
  v1::ClusterNode n;
  n.set_node_rank(rank);
  n.set_address("n:" + std::to_string(rank));
  n.set_state(state);
  n.set_last_heartbeat_age_s(age);
  n.set_instance(instance + std::to_string(rank));
  return n;
}

MemberView::Nodes List(std::initializer_list<v1::ClusterNode> nodes) {
  MemberView::Nodes out;
  for (const v1::ClusterNode& n : nodes) *out.Add() = n;
  return out;
}

const v1::NodeStatus* Find(const v1::NodesResponse& r, int rank) {
  for (const v1::NodeStatus& s : r.nodes()) {
    if (s.node_rank() == rank) return &s;
  }
  return nullptr;
}

TEST(MemberViewTest, NoChangeAnswerKeepsTheViewAndAgesFromThatAnswer) {
  MemberView v(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto events = v.Apply(
      5, List({Node(0, "alive", 0.2), Node(1, "alive", 0.4), Node(2, "lost", 7)}),
      /*delta=*/false, /*self=*/1, t0);
  EXPECT_EQ(events.size(), 1u);  // 0 joined (2 was never alive; 1 is self)
  EXPECT_EQ(v.nodes_epoch(), 5u);
  // A heartbeat answer with no change, one second later.
  events = v.Apply(5, {}, /*delta=*/true, 1, t0 + absl::Seconds(1));
  EXPECT_TRUE(events.empty());
  v1::NodesResponse r;
  v.Fill(&r, 1, t0 + absl::Milliseconds(1500));
  ASSERT_EQ(r.nodes_size(), 3);
  EXPECT_DOUBLE_EQ(Find(r, 0)->last_heartbeat_age_s(), 0.5);  // vouched for at t0 + 1 s
  EXPECT_EQ(Find(r, 0)->state(), "alive");
  EXPECT_TRUE(Find(r, 1)->self());
  EXPECT_FALSE(Find(r, 0)->self());
  EXPECT_DOUBLE_EQ(Find(r, 2)->last_heartbeat_age_s(), 8.5);  // lost: keeps growing
  EXPECT_EQ(v.epoch(), 5u);
  // Without any answer the ages keep growing.
  r.Clear();
  v.Fill(&r, 1, t0 + absl::Seconds(4));
  EXPECT_DOUBLE_EQ(Find(r, 0)->last_heartbeat_age_s(), 3.0);
}

TEST(MemberViewTest, DeltasBecomeEventsAndMergeByRank) {
  MemberView v(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Apply(3, List({Node(0, "alive", 0), Node(1, "alive", 0), Node(2, "alive", 0)}), false, 0,
          t0);
  // Node 1 lost, node 2 restarted (new instance), node 3 new.
  auto events = v.Apply(4,
                        List({Node(1, "lost", 5.1), Node(2, "alive", 0.1, "again"),
                              Node(3, "alive", 0.3)}),
                        true, 0, t0 + absl::Seconds(1));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(events[0].node, 1);
  EXPECT_EQ(events[1].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(events[1].node, 2);
  EXPECT_EQ(events[1].old_instance, "i2");
  EXPECT_EQ(events[2].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[3].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[3].node, 3);
  EXPECT_EQ(v.size(), 4u);
  EXPECT_EQ(v.epoch(), 4u);
  v1::NodesResponse r;
  v.Fill(&r, 0, t0 + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(Find(r, 3)->last_heartbeat_age_s(), 1.3);  // arrived in the latest answer
  EXPECT_DOUBLE_EQ(Find(r, 0)->last_heartbeat_age_s(), 1.0);  // vouched for by it
  EXPECT_DOUBLE_EQ(Find(r, 1)->last_heartbeat_age_s(), 6.1);
}

TEST(MemberViewTest, RanksOutOfRangeAreDroppedAndClearKeepsTheEpoch) {
  MemberView v(2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto events =
      v.Apply(7, List({Node(0, "alive", 0), Node(1, "alive", 0), Node(2, "alive", 0),
                       Node(-1, "alive", 0)}),
              false, 0, t0);
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(events.size(), 1u);  // node 1 joined
  auto alive = v.Clear(0);
  ASSERT_EQ(alive.size(), 1u);
  EXPECT_EQ(alive[0].node_rank(), 1);
  EXPECT_EQ(v.size(), 0u);
  EXPECT_EQ(v.nodes_epoch(), 0u);  // holds no list: the next heartbeat asks for all
  EXPECT_EQ(v.epoch(), 7u);        // what the next join names as last_epoch
}

}  // namespace
}  // namespace hsdp
