// The parts both memberships share (member_status.h): the status shown by
// `hsdpctl nodes`, the bounded outbox of group events, and the helpers.
#include "daemon/cluster/member_status.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hsdp {
namespace {

v1::GroupEvent Event(const std::string& key) {
  v1::GroupEvent e;
  e.set_group_key(key);
  e.set_epoch(1);
  return e;
}

TEST(MemberStatusTest, StatesAndTheContactAgeTheViewShows) {
  MemberStatus s;
  v1::NodesResponse r;
  EXPECT_EQ(s.FillView(&r, absl::Now()), 0);
  EXPECT_EQ(r.state(), "joining");
  EXPECT_EQ(r.coordinator_contact_age_s(), -1);  // never answered
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  s.Contact(t0);
  EXPECT_EQ(s.FillView(&r, t0 + absl::Seconds(3)), 3);
  EXPECT_EQ(r.state(), "ok");
  EXPECT_EQ(r.coordinator_contact_age_s(), 3);
  s.Degraded("etcd has not answered");
  s.FillView(&r, t0);
  EXPECT_EQ(r.state(), "degraded");
  EXPECT_EQ(r.detail(), "etcd has not answered");
  s.Contact(t0);
  EXPECT_EQ(s.detail(), "");
  s.Stopped();
  EXPECT_EQ(s.state(), "stopped");
  // A failure stays visible after Stop.
  MemberStatus f;
  f.Failed(absl::PermissionDeniedError("bad token"));
  f.Stopped();
  EXPECT_EQ(f.state(), "failed");
  EXPECT_EQ(f.detail(), "bad token");
}

TEST(GroupEventOutboxTest, BoundedOldestDroppedBatchesAndHeldBack) {
  GroupEventOutbox box(3, "the coordinator");
  EXPECT_FALSE(box.ready());
  for (const char* k : {"a", "b", "c", "d"}) box.Push(Event(k));
  ASSERT_EQ(box.size(), 3u);  // "a" dropped
  std::vector<v1::GroupEvent> front = box.Front(2);
  ASSERT_EQ(front.size(), 2u);
  EXPECT_EQ(front[0].group_key(), "b");
  EXPECT_EQ(front[1].group_key(), "c");
  EXPECT_EQ(box.size(), 3u);  // Front does not take them
  EXPECT_TRUE(box.ready());
  box.set_held_back(true);
  EXPECT_FALSE(box.ready());
  box.set_held_back(false);
  box.Pop(2);
  ASSERT_EQ(box.Front(10).size(), 1u);
  EXPECT_EQ(box.Front(10)[0].group_key(), "d");
  box.Pop(5);  // more than there are: empties it
  EXPECT_TRUE(box.empty());
  EXPECT_FALSE(box.ready());
}

TEST(MemberHelpersTest, PermanentJoinErrorsInstanceIdsAndPeerEvents) {
  EXPECT_TRUE(PermanentJoinError(absl::UnauthenticatedError("")));
  EXPECT_TRUE(PermanentJoinError(absl::AlreadyExistsError("")));
  EXPECT_FALSE(PermanentJoinError(absl::UnavailableError("")));
  EXPECT_FALSE(PermanentJoinError(absl::DeadlineExceededError("")));
  const std::string a = NewInstanceId(), b = NewInstanceId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
  std::vector<int> seen;
  FirePeerEvents({{PeerEvent::Kind::kLost, 3, "node 3 was lost", ""},
                  {PeerEvent::Kind::kJoined, 4, "node 4 joined", ""}},
                 [&](const PeerEvent& e) { seen.push_back(e.node); });
  EXPECT_EQ(seen, (std::vector<int>{3, 4}));
  FirePeerEvents({{PeerEvent::Kind::kLost, 1, "x", ""}}, nullptr);  // no sink: only logged
}

}  // namespace
}  // namespace hsdp
