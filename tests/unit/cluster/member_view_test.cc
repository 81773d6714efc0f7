// MemberView: a whole list, deltas merged by rank, the PeerEvents they make,
// ages (an alive entry a no-change answer vouched for is as old as that
// answer), entries from the store with ranks out of range, the etcd
// member's Alive / Lost / Present, rejoining (LoseAll), sparse views (news
// only; unheard-of ranks), live neighbours and the `hsdpctl nodes` answer.
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

TEST(MemberViewTest, RanksOutOfRangeAreDropped) {
  MemberView v(2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto events =
      v.Apply(7, List({Node(0, "alive", 0), Node(1, "alive", 0), Node(2, "alive", 0),
                       Node(-1, "alive", 0)}),
              false, 0, t0);
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(events.size(), 1u);  // node 1 joined
  EXPECT_TRUE(v.Alive(Node(5, "alive", 0), 7, 0, t0).empty());
  EXPECT_EQ(v.size(), 2u);
}

// Both members rejoin the same way. Before, the coordinator's member forgot
// the list while it joined again (`hsdpctl nodes` showed no node) and the
// etcd member showed them lost: now both show them lost, as the events say.
TEST(MemberViewTest, LoseAllReportsEveryOtherAliveNodeLostAndKeepsThemShown) {
  MemberView v(3);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Apply(7, List({Node(0, "alive", 0), Node(1, "alive", 0), Node(2, "lost", 3)}), false, 0, t0);
  auto lost = v.LoseAll(0, "this node lost contact with the coordinator c:1 (declared lost)",
                        t0 + absl::Seconds(1));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(lost[0].node, 1);
  EXPECT_EQ(lost[0].why,
            "this node lost contact with the coordinator c:1 (declared lost) and joins again; "
            "node 1 (n:1) is treated as lost meanwhile");
  EXPECT_EQ(v.nodes_epoch(), 0u);  // the next heartbeat asks for the whole list
  EXPECT_EQ(v.epoch(), 7u);        // what the next join names as last_epoch
  v1::NodesResponse r;
  v.Fill(&r, 0, t0 + absl::Seconds(3));
  ASSERT_EQ(r.nodes_size(), 3);
  EXPECT_EQ(Find(r, 0)->state(), "alive");  // self
  EXPECT_EQ(Find(r, 1)->state(), "lost");
  EXPECT_DOUBLE_EQ(Find(r, 1)->last_heartbeat_age_s(), 2.0);  // since this node gave it up
  EXPECT_TRUE(v.LoseAll(0, "again", t0 + absl::Seconds(2)).empty());  // nothing twice
  // Joined again: the whole list makes them joined.
  auto joined = v.Apply(8, List({Node(0, "alive", 0), Node(1, "alive", 0)}), false, 0,
                        t0 + absl::Seconds(4));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(v.nodes_epoch(), 8u);
}

v1::ClusterNode Replacing(v1::ClusterNode n, const std::string& previous) {
  n.set_previous_instance(previous);
  return n;
}

// A sparse view starts from its join answer (its own entry) and hears only
// news: an unheard-of rank in a delta was alive until now.
TEST(MemberViewTest, ASparseViewReadsUnheardRanksInDeltasAsAliveUntilNow) {
  MemberView v(6, "no heartbeat", MemberView::Kind::kSparse);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(v.Apply(10, List({Node(0, "alive", 0)}), false, 0, t0).empty());
  EXPECT_EQ(v.nodes_epoch(), 10u);
  EXPECT_TRUE(v.news_only());
  // 2 lost; 3 restarted (instance b3 replaced i3); 4 a first join (from a
  // coordinator that sends them).
  auto events = v.Apply(11,
                        List({Node(2, "lost", 5), Replacing(Node(3, "alive", 0, "b"), "i3"),
                              Node(4, "alive", 0)}),
                        true, 0, t0 + absl::Seconds(1));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(events[0].node, 2);
  EXPECT_EQ(events[0].old_instance, "");
  EXPECT_EQ(events[1].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(events[1].node, 3);
  EXPECT_EQ(events[1].old_instance, "i3");
  EXPECT_EQ(events[2].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[2].node, 3);
  EXPECT_EQ(events[3].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[3].node, 4);
  // Rank 2 is awaited: first joins are asked for until it is back.
  EXPECT_EQ(v.awaited(), 1u);
  EXPECT_FALSE(v.news_only());
  events = v.Apply(12, List({Replacing(Node(2, "alive", 0, "c"), "i2")}), true, 0,
                   t0 + absl::Seconds(2));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[0].node, 2);
  EXPECT_EQ(v.awaited(), 0u);
  EXPECT_TRUE(v.news_only());
  EXPECT_EQ(v.size(), 4u);  // 0, 2, 3, 4: the ranks it heard of
  // A whole view never asks for news only.
  EXPECT_FALSE(MemberView(6).news_only());
}

// Joining again, a sparse view reports the ranks it never heard of lost in
// one event and awaits them; the whole list of the rejoin joins those alive,
// and first joins are asked for until the last is back.
TEST(MemberViewTest, LoseAllInASparseViewCoversTheRanksItNeverHeardOf) {
  MemberView v(5, "no heartbeat", MemberView::Kind::kSparse);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Apply(3, List({Node(0, "alive", 0)}), false, 0, t0);
  ASSERT_EQ(v.Apply(4, List({Node(1, "lost", 5)}), true, 0, t0).size(), 1u);
  auto lost = v.LoseAll(0, "declared lost", t0 + absl::Seconds(1));
  ASSERT_EQ(lost.size(), 1u);  // rank 1 was reported lost already
  EXPECT_EQ(lost[0].kind, PeerEvent::Kind::kLost);
  EXPECT_EQ(lost[0].node, PeerEvent::kUnheardNodes);
  EXPECT_EQ(lost[0].why,
            "declared lost and joins again; the 3 node rank(s) it had not heard of are treated "
            "as lost meanwhile");
  EXPECT_EQ(v.awaited(), 4u);
  EXPECT_TRUE(v.stale());
  EXPECT_TRUE(v.LoseAll(0, "again", t0 + absl::Seconds(2)).empty());  // nothing twice
  auto joined = v.Apply(6,
                        List({Node(0, "alive", 0), Replacing(Node(1, "alive", 0, "n"), "i1"),
                              Node(2, "alive", 0), Node(3, "alive", 0)}),
                        false, 0, t0 + absl::Seconds(3));
  ASSERT_EQ(joined.size(), 3u);
  for (const PeerEvent& e : joined) EXPECT_EQ(e.kind, PeerEvent::Kind::kJoined);
  EXPECT_FALSE(v.stale());
  EXPECT_EQ(v.awaited(), 1u);  // rank 4
  EXPECT_FALSE(v.news_only());
  joined = v.Apply(7, List({Node(4, "alive", 0)}), true, 0, t0 + absl::Seconds(4));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(joined[0].node, 4);
  EXPECT_TRUE(v.news_only());
}

TEST(MemberViewTest, KeysPutAndGoneBecomeTheSameEventsAsAnswers) {
  MemberView v(4, "its lease expired");
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto events = v.Alive(Node(1, "", 0), 3, 0, t0);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].why, "node 1 (n:1) joined; cluster epoch 3");
  EXPECT_TRUE(v.Alive(Node(1, "", 0), 3, 0, t0).empty());  // the same instance again
  events = v.Alive(Node(1, "", 0, "again"), 4, 0, t0);
  ASSERT_EQ(events.size(), 2u);  // restarted
  EXPECT_EQ(events[0].old_instance, "i1");
  events = v.Lost(1, 5, 0, t0 + absl::Seconds(1));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].why, "node 1 (n:1) was lost (its lease expired); cluster epoch 5");
  EXPECT_TRUE(v.Lost(1, 5, 0, t0).empty());  // not alive any more
  EXPECT_TRUE(v.Lost(3, 5, 0, t0).empty());  // never seen
  EXPECT_EQ(v.Find(1)->state(), "lost");
  EXPECT_EQ(v.Find(1)->address(), "n:1");  // the entry keeps what was known
}

// The etcd member's join reads every live node. Before, a peer found there
// with another instance than the one this node knew alive became a join
// only; now it is a restart (lost with its old instance, then joined), as
// everywhere else.
TEST(MemberViewTest, PresentMakesTheListedNodesAliveAndTheOthersLost) {
  MemberView v(5);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Present({Node(0, "", 0), Node(1, "", 0), Node(2, "", 0)}, 2, 0, t0);
  auto events =
      v.Present({Node(0, "", 0), Node(2, "", 0, "new"), Node(4, "", 0)}, 3, 0, t0 + absl::Seconds(1));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, PeerEvent::Kind::kLost);  // 2 restarted
  EXPECT_EQ(events[0].node, 2);
  EXPECT_EQ(events[0].old_instance, "i2");
  EXPECT_EQ(events[1].kind, PeerEvent::Kind::kJoined);
  EXPECT_EQ(events[1].node, 2);
  EXPECT_EQ(events[2].kind, PeerEvent::Kind::kJoined);  // 4 new
  EXPECT_EQ(events[2].node, 4);
  EXPECT_EQ(events[3].kind, PeerEvent::Kind::kLost);  // 1 not listed
  EXPECT_EQ(events[3].node, 1);
  EXPECT_TRUE(events[3].old_instance.empty());
}

TEST(MemberViewTest, LiveNeighboursSkipLostNodesAndWrapAround) {
  MemberView v(8);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Present({Node(1, "", 0), Node(3, "", 0), Node(5, "", 0), Node(6, "", 0)}, 1, 1, t0);
  v.Lost(5, 2, 1, t0);
  EXPECT_EQ(v.LiveSuccessor(3), 6);
  EXPECT_EQ(v.LiveSuccessor(5), 6);
  EXPECT_EQ(v.LiveSuccessor(6), 1);  // wraps
  EXPECT_EQ(v.LiveSuccessor(4), 6);  // a rank not in the view
  EXPECT_EQ(v.LivePredecessor(1), 6);
  EXPECT_EQ(v.LivePredecessor(6), 3);
  EXPECT_EQ(v.LivePredecessor(5), 3);
  EXPECT_EQ(v.LivePredecessor(0), 6);
  MemberView one(4);
  one.Present({Node(2, "", 0)}, 1, 2, t0);
  EXPECT_EQ(one.LiveSuccessor(2), -1);  // only itself
  EXPECT_EQ(one.LivePredecessor(2), -1);
  EXPECT_EQ(one.LiveSuccessor(0), 2);
}

TEST(MemberViewTest, ResponseHasTheStatusTheStoreAndVouchedAges) {
  MemberView v(3);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Present({Node(0, "", 0), Node(1, "", 0)}, 4, 1, t0);
  v.RaiseEpoch(6);
  v.RaiseEpoch(5);  // never back
  v.Vouch(t0 + absl::Seconds(2));  // a renewal: every live key still there
  MemberStatus status;
  status.Contact(t0 + absl::Seconds(2));
  const v1::NodesResponse r = v.Response(status, 1, "etcd (e:1)", false, t0 + absl::Seconds(3));
  EXPECT_TRUE(r.enabled());
  EXPECT_EQ(r.state(), "ok");
  EXPECT_EQ(r.epoch(), 6u);
  EXPECT_EQ(r.node_rank(), 1);
  EXPECT_EQ(r.coordinator(), "etcd (e:1)");
  EXPECT_FALSE(r.is_coordinator());
  EXPECT_EQ(r.expected_nodes(), 3u);
  ASSERT_EQ(r.nodes_size(), 2);
  EXPECT_DOUBLE_EQ(Find(r, 0)->last_heartbeat_age_s(), 1.0);
  EXPECT_TRUE(Find(r, 1)->self());
}

// `hsdpctl nodes` on a sparse member: its own entries, completed from the
// store's whole list with the ranks it never heard of as it counts them at
// its epoch (a later first join not yet; later news still alive).
TEST(MemberViewTest, UnheardRanksCompleteTheAnswerAsTheMemberCountsThem) {
  MemberView v(6, "no heartbeat", MemberView::Kind::kSparse);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  v.Apply(10, List({Node(0, "alive", 0)}), false, 0, t0);
  v.Apply(11, List({Node(2, "lost", 4)}), true, 0, t0);
  auto entry = [](int rank, const std::string& state, uint64_t changed, bool first = true) {
    v1::ClusterNode n = Node(rank, state, 0.5, "c");
    n.set_changed_epoch(changed);
    if (!first) n.set_previous_instance("old");
    return n;
  };
  v1::ListResponse list;
  list.set_epoch(13);
  for (const v1::ClusterNode& n :
       {entry(0, "alive", 1), entry(1, "alive", 5), entry(2, "alive", 13, false),
        entry(3, "lost", 12), entry(4, "alive", 13), entry(5, "lost", 3)}) {
    *list.add_nodes() = n;
  }
  MemberStatus status;
  status.Contact(t0);
  v1::NodesResponse r = v.Response(status, 0, "c:1", false, t0);
  v.AddUnheard(list, &r);
  EXPECT_EQ(r.epoch(), 11u);  // the member's, not the store's
  ASSERT_EQ(r.nodes_size(), 5);
  std::vector<int> ranks;
  for (const v1::NodeStatus& n : r.nodes()) ranks.push_back(n.node_rank());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3, 5}));  // 4's first join is not applied yet
  EXPECT_TRUE(Find(r, 0)->self());
  EXPECT_EQ(Find(r, 1)->state(), "alive");
  EXPECT_DOUBLE_EQ(Find(r, 1)->last_heartbeat_age_s(), 0.5);
  EXPECT_EQ(Find(r, 2)->state(), "lost");   // heard of: its own entry, not the store's
  EXPECT_EQ(Find(r, 3)->state(), "alive");  // its loss comes with the next heartbeat
  EXPECT_EQ(Find(r, 5)->state(), "lost");   // lost before this member's epoch
}

}  // namespace
}  // namespace hsdp
