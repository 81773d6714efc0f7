// Coordinator membership: rank assignment, rejoin, conflicts, loss by
// missed heartbeats and the epoch; the group event log (Report, cursors on
// heartbeats, its bounds).
#include "daemon/cluster/coordinator.h"

#include "daemon/util/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::ElementsAre;

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

Coordinator::Options Opts(const Clock* clock = nullptr) {
  return {.self_address = "c:1", .nodes = 3, .heartbeat_ms = 100, .missed_heartbeats = 3,
          .clock = clock};
}

TEST(CoordinatorTest, RanksByJoinOrderWithZeroForTheCoordinator) {
  Coordinator c(Opts());
  auto a = c.Join(Req("a:1", "ia"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->node_rank(), 1);
  EXPECT_EQ(a->epoch(), 1u);  // the first join is published at once
  auto self = c.Join(Req("c:1", "ic"));
  ASSERT_TRUE(self.ok());
  EXPECT_EQ(self->node_rank(), 0);
  EXPECT_EQ(self->epoch(), 1u);  // its own join is in the next step
  c.Step();
  auto b = c.Join(Req("b:1", "ib"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->node_rank(), 2);
  EXPECT_EQ(b->epoch(), 2u);
  EXPECT_EQ(b->nodes_size(), 3);  // epoch 2's list and its own entry
  c.Step();
  EXPECT_EQ(c.epoch(), 3u);
  auto full = c.Join(Req("d:1", "id"));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  // The same instance joining again changes nothing.
  auto again = c.Join(Req("a:1", "ia"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->node_rank(), 1);
  EXPECT_EQ(again->epoch(), 3u);
  c.Step();
  EXPECT_EQ(c.epoch(), 3u);
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
  FakeClock clock;  // time moves only below (the monitor thread is not started)
  Coordinator c(Opts(&clock));
  ASSERT_TRUE(c.Join(Req("c:1", "ic")).ok());
  ASSERT_TRUE(c.Join(Req("a:1", "ia")).ok());
  c.Step();
  const uint64_t before = c.epoch();
  v1::HeartbeatRequest hb;
  hb.set_node_rank(0);
  hb.set_instance("ic");
  clock.Advance(300'000'000);  // silent for exactly 3 x 100 ms: not yet lost
  c.CheckLiveness();
  EXPECT_EQ(c.epoch(), before);
  // 0 heartbeats; 1 stays silent past 3 x 100 ms.
  ASSERT_TRUE(c.Heartbeat(hb).ok());
  clock.Advance(1'000'000);
  c.CheckLiveness();
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
  EXPECT_EQ(back->epoch(), before + 1);  // published in the next step
  c.Step();
  EXPECT_EQ(c.epoch(), before + 2);
}

TEST(CoordinatorTest, RestartedCoordinatorContinuesTheEpoch) {
  Coordinator c(Opts());
  v1::JoinRequest r = Req("a:1", "ia");
  r.set_last_epoch(17);
  auto a = c.Join(r);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->epoch(), 18u);
}

// Heartbeat answers carry the node list only as far as the asking node lacks
// it: nothing while the epoch stands still, the entries that changed after
// the node's epoch when it moved, the whole list to a node that names none.
TEST(CoordinatorTest, HeartbeatsCarryOnlyTheNodesThatChangedAfterTheNodesEpoch) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  auto zero = c.Join(Req("c:1", "ic"));
  ASSERT_TRUE(zero.ok());
  ASSERT_TRUE(c.Join(Req("a:1", "ia")).ok());
  auto b = c.Join(Req("b:1", "ib"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->nodes_size(), 2);  // epoch 1's list (node 0) and its own entry
  c.Step();
  const uint64_t e = c.epoch();
  ASSERT_EQ(e, zero->epoch() + 1);
  auto beat = [&](int rank, const std::string& instance, uint64_t nodes_epoch) {
    v1::HeartbeatRequest h;
    h.set_node_rank(rank);
    h.set_instance(instance);
    h.set_nodes_epoch(nodes_epoch);
    absl::StatusOr<v1::HeartbeatResponse> r = c.Heartbeat(h);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::HeartbeatResponse();
  };
  auto ranks = [](const v1::HeartbeatResponse& r) {
    std::vector<int> out;
    for (const v1::ClusterNode& n : r.nodes()) out.push_back(n.node_rank());
    return out;
  };
  // Steady state: the epoch the node holds is current.
  v1::HeartbeatResponse r = beat(2, "ib", e);
  EXPECT_TRUE(r.nodes_delta());
  EXPECT_EQ(r.epoch(), e);
  EXPECT_EQ(r.nodes_size(), 0);
  // Node 0 holds the list of its own join (the epoch before a's and b's).
  r = beat(0, "ic", zero->epoch());
  EXPECT_TRUE(r.nodes_delta());
  EXPECT_THAT(ranks(r), ElementsAre(1, 2));
  // No epoch named (a node that predates nodes_epoch): the whole list.
  r = beat(0, "ic", 0);
  EXPECT_FALSE(r.nodes_delta());
  EXPECT_THAT(ranks(r), ElementsAre(0, 1, 2));
  // An epoch this coordinator never reached (it restarted under the node;
  // the node would have had to join again first): the whole list.
  r = beat(0, "ic", e + 5);
  EXPECT_FALSE(r.nodes_delta());
  EXPECT_EQ(r.nodes_size(), 3);
  // Node 1 goes silent and is lost: the others get that one entry.
  beat(0, "ic", e);
  beat(2, "ib", e);
  clock.Advance(250'000'000);
  beat(0, "ic", e);
  beat(2, "ib", e);
  clock.Advance(100'000'000);
  c.CheckLiveness();
  ASSERT_EQ(c.epoch(), e + 1);
  r = beat(2, "ib", e);
  EXPECT_TRUE(r.nodes_delta());
  ASSERT_THAT(ranks(r), ElementsAre(1));
  EXPECT_EQ(r.nodes(0).state(), "lost");
  EXPECT_EQ(beat(2, "ib", e + 1).nodes_size(), 0);
  // It joins again (a new instance): that entry once more.
  ASSERT_TRUE(c.Join(Req("a:1", "ia2")).ok());
  EXPECT_EQ(beat(0, "ic", e + 1).nodes_size(), 0);  // not published yet
  c.Step();
  r = beat(0, "ic", e + 1);
  ASSERT_THAT(ranks(r), ElementsAre(1));
  EXPECT_EQ(r.nodes(0).state(), "alive");
  EXPECT_EQ(r.nodes(0).instance(), "ia2");
}


v1::ReportRequest Report(int rank, const std::string& instance, int events, uint32_t epoch = 1) {
  v1::ReportRequest r;
  r.set_node_rank(rank);
  r.set_instance(instance);
  for (int i = 0; i < events; ++i) {
    v1::GroupEvent* e = r.add_events();
    e->set_group_key("4:job1/0,1,2#0");
    e->set_epoch(epoch + i);
    e->set_why("rank 1 left the job");
    e->set_origin_node(99);  // forged: the coordinator sets the real one
  }
  return r;
}

absl::StatusOr<v1::HeartbeatResponse> Beat(Coordinator& c, int rank, const std::string& instance,
                                           uint64_t after) {
  v1::HeartbeatRequest h;
  h.set_node_rank(rank);
  h.set_instance(instance);
  h.set_events_after(after);
  return c.Heartbeat(h);
}

TEST(CoordinatorTest, ReportedGroupEventsReachOtherMembersOnHeartbeatsByCursor) {
  Coordinator c(Opts());
  ASSERT_TRUE(c.Join(Req("a:1", "ia")).ok());
  auto b = c.Join(Req("b:1", "ib"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->events_last(), 0u);
  ASSERT_TRUE(c.Report(Report(1, "ia", 2)).ok());
  auto h = Beat(c, 2, "ib", 0);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->events_size(), 2);
  EXPECT_EQ(h->events(0).origin_node(), 1);
  EXPECT_EQ(h->events(0).epoch(), 1u);
  EXPECT_EQ(h->events(1).seq(), 2u);
  EXPECT_EQ(h->events_last(), 2u);
  EXPECT_FALSE(h->events_missed());
  // Nothing new after the cursor.
  h = Beat(c, 2, "ib", 2);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->events_size(), 0);
  // A node that joins later starts its cursor at the newest event.
  auto late = c.Join(Req("c:1", "ic"));
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->events_last(), 2u);
  // A cursor from before a coordinator restart (beyond the log) starts over.
  h = Beat(c, 2, "ib", 1000);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->events_size(), 2);
}

TEST(CoordinatorTest, ReportsAreBoundedAndOnlyFromLiveMembers) {
  Coordinator c(Opts());
  ASSERT_TRUE(c.Join(Req("a:1", "ia")).ok());
  EXPECT_EQ(c.Report(Report(1, "someone-else", 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Report(Report(7, "ia", 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Report(Report(1, "ia", Coordinator::kMaxReportEvents + 1)).code(),
            absl::StatusCode::kInvalidArgument);
  v1::ReportRequest big = Report(1, "ia", 1);
  big.mutable_events(0)->set_group_key(std::string(Coordinator::kMaxEventField + 1, 'k'));
  EXPECT_EQ(c.Report(big).code(), absl::StatusCode::kInvalidArgument);
  v1::ReportRequest empty = Report(1, "ia", 1);
  empty.mutable_events(0)->set_group_key("");
  EXPECT_EQ(c.Report(empty).code(), absl::StatusCode::kInvalidArgument);
  // A flood keeps only the newest kMaxEventLog events; a slow reader is told.
  for (size_t i = 0; i < Coordinator::kMaxEventLog / Coordinator::kMaxReportEvents + 2; ++i) {
    ASSERT_TRUE(c.Report(Report(1, "ia", Coordinator::kMaxReportEvents)).ok());
  }
  auto h = Beat(c, 1, "ia", 1);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->events_missed());
  EXPECT_EQ(static_cast<size_t>(h->events_size()), Coordinator::kMaxEventsPerHeartbeat);
  EXPECT_LT(h->events_last(), (Coordinator::kMaxEventLog / Coordinator::kMaxReportEvents + 2) *
                                  Coordinator::kMaxReportEvents);
}

}  // namespace
}  // namespace hsdp
