// Group matching against a FakeEngine: ops start only when every member's
// submission is in, run in sequence order, and every outcome (success,
// disagreement, timeout, member gone) reaches every member.
#include "daemon/dataplane/group.h"

#include <map>

#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::CompletionOf;
using testing::FakeEngine;
using testing::MakeSession;
using testing::StatusOf;

constexpr int64_t kTimeoutNs = 1'000'000'000;

class GroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Global ranks 10..13 in a job of 14 (group ranks differ from global ones).
    for (int r = 0; r < 4; ++r) sessions_.push_back(MakeSession(100 + r, 10 + r, 14));
  }

  std::shared_ptr<Group> NewGroup(uint32_t id, std::vector<int> global_ranks) {
    GroupSpec spec;
    spec.id = id;
    spec.key = GroupKey(JobKey{0, "job"}, global_ranks, 0);
    spec.job_id = "job";
    spec.ranks = global_ranks;
    spec.timeout_ns = kTimeoutNs;
    spec.max_pending = 64;
    auto g = std::make_shared<Group>(std::move(spec), &engine_,
                                     [this](uint32_t gid) -> std::shared_ptr<Group> {
                                       auto it = groups_.find(gid);
                                       return it == groups_.end() ? nullptr : it->second;
                                     });
    for (size_t i = 0; i < global_ranks.size(); ++i) {
      auto epoch = g->Join(static_cast<int>(i), SessionOf(global_ranks[i]));
      EXPECT_TRUE(epoch.ok() && *epoch == 1u);
    }
    groups_[id] = g;
    return g;
  }

  std::shared_ptr<Session> SessionOf(int global_rank) { return sessions_[global_rank - 10]; }

  // Member `group_rank` of `g` submits op `op_id` with sequence `seq`.
  Arrival Make(const Group& g, int group_rank, uint64_t op_id, uint64_t seq,
               Collective c = Collective::kAllReduce, uint64_t count = 8) {
    Arrival a;
    a.session = SessionOf(g.ranks()[group_rank]);
    a.desc.op_id = op_id;
    a.desc.seq = seq;
    a.desc.collective = static_cast<uint8_t>(c);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    a.desc.count = count;
    a.desc.premul_factor = a.desc.pre_divide = a.desc.post_divide = 1.0;
    a.desc.group_id = g.id();
    a.desc.epoch = 1;
    a.epoch = 1;
    a.seq = seq;
    a.send = &fake_mem_[group_rank][0];
    a.recv = &fake_mem_[group_rank][1];
    a.first_ns = shm::NowNanos();
    return a;
  }

  // The status written to global rank `rank`'s session for `op_id`.
  std::optional<absl::Status> Result(int global_rank, uint64_t op_id) {
    const shm::Completion* c = CompletionOf(*SessionOf(global_rank), op_id);
    if (c == nullptr) return std::nullopt;
    return StatusOf(*c);
  }

  FakeEngine engine_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::map<uint32_t, std::shared_ptr<Group>> groups_;
  char fake_mem_[4][2] = {};
};

TEST_F(GroupTest, StartsOnlyWhenAllMembersArrived) {
  auto g = NewGroup(1, {10, 11, 12});
  g->Arrive(0, Make(*g, 0, 1, 1));
  g->Arrive(2, Make(*g, 2, 5, 1));
  EXPECT_EQ(engine_.pending(), 0u);
  EXPECT_FALSE(Result(10, 1).has_value());
  g->Arrive(1, Make(*g, 1, 3, 1));
  ASSERT_EQ(engine_.pending(), 1u);
  const EngineTask& t = engine_.front();
  EXPECT_EQ(t.collective, Collective::kAllReduce);
  EXPECT_EQ(t.count, 8u);
  ASSERT_EQ(t.members.size(), 3u);
  for (int r = 0; r < 3; ++r) {  // by group rank
    EXPECT_TRUE(t.members[r].local);
    EXPECT_EQ(t.members[r].global_rank, 10 + r);
    EXPECT_EQ(t.members[r].send.data, &fake_mem_[r][0]);
    EXPECT_EQ(t.members[r].recv.data, &fake_mem_[r][1]);
    EXPECT_EQ(t.members[r].send.bytes, 8u * 4);
  }
  EXPECT_EQ(t.group_key, g->key());
  EXPECT_EQ(t.epoch, 1u);
  EXPECT_EQ(t.seq, 1u);
  EXPECT_EQ(t.priority, 1);
  EXPECT_FALSE(Result(10, 1).has_value());  // not before the engine finishes
  engine_.Finish();
  // Each member's own op id completes OK.
  ASSERT_TRUE(Result(10, 1).has_value());
  EXPECT_TRUE(Result(10, 1)->ok());
  EXPECT_TRUE(Result(11, 3).value_or(absl::UnknownError("none")).ok());
  EXPECT_TRUE(Result(12, 5).value_or(absl::UnknownError("none")).ok());
  EXPECT_EQ(g->stats().ops_started, 1u);
  EXPECT_EQ(g->stats().pending, 0u);
}

TEST_F(GroupTest, TasksCarryTheJobsClassAndALatencyCriticalMark) {
  // The job's class level (from its priority class) reaches every task; an
  // op any member marks latency-critical runs ahead of the job's other work.
  GroupSpec spec;
  spec.id = 7;
  spec.key = GroupKey(JobKey{0, "job"}, {10, 11}, 0);
  spec.job_id = "job";
  spec.ranks = {10, 11};
  spec.timeout_ns = kTimeoutNs;
  spec.qos_class = 6;
  auto g = std::make_shared<Group>(std::move(spec), &engine_,
                                   [](uint32_t) { return std::shared_ptr<Group>(); });
  ASSERT_TRUE(g->Join(0, SessionOf(10)).ok());
  ASSERT_TRUE(g->Join(1, SessionOf(11)).ok());
  g->Arrive(0, Make(*g, 0, 1, 1, Collective::kAllReduce));
  g->Arrive(1, Make(*g, 1, 1, 1, Collective::kAllReduce));
  Arrival marked = Make(*g, 1, 2, 2, Collective::kAllGather);
  marked.desc.flags = shm::kFlagLatencyCritical;  // one member is enough
  g->Arrive(0, Make(*g, 0, 2, 2, Collective::kAllGather));
  g->Arrive(1, std::move(marked));
  g->Arrive(0, Make(*g, 0, 3, 3, Collective::kAllGather));
  g->Arrive(1, Make(*g, 1, 3, 3, Collective::kAllGather));
  ASSERT_EQ(engine_.pending(), 3u);
  EngineTask t = engine_.Finish();
  EXPECT_EQ(t.qos_class, 6);
  EXPECT_EQ(t.job, (JobKey{0, "job"}).Encoded());
  EXPECT_EQ(t.priority, 1);  // all-reduce
  t = engine_.Finish();
  EXPECT_EQ(t.qos_class, 6);
  EXPECT_EQ(t.priority, -1);  // marked: ahead of all-gathers and all-reduces
  t = engine_.Finish();
  EXPECT_EQ(t.priority, 0);   // an unmarked all-gather
}

TEST_F(GroupTest, LaunchesInSequenceOrderWithoutWaitingForCompletion) {
  auto g = NewGroup(1, {10, 11});
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    g->Arrive(0, Make(*g, 0, seq, seq, Collective::kAllReduce, seq * 100));
    g->Arrive(1, Make(*g, 1, seq, seq, Collective::kAllReduce, seq * 100));
  }
  // A stream-ordered engine orders each launch at once: all three are in flight.
  ASSERT_EQ(engine_.pending(), 3u);
  EXPECT_EQ(g->stats().running, 3u);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    EXPECT_EQ(engine_.front().count, seq * 100);
    EXPECT_EQ(engine_.front().seq, seq);
    EXPECT_FALSE(Result(10, seq).has_value());
    engine_.Finish();
    EXPECT_TRUE(Result(10, seq).has_value());
    EXPECT_TRUE(Result(11, seq).has_value());
  }
  EXPECT_EQ(engine_.pending(), 0u);
  EXPECT_EQ(g->stats().running, 0u);
}

TEST_F(GroupTest, OnlyOneOperationWaitsForItsLaunchAtATime) {
  engine_.HoldLaunches(true);
  auto g = NewGroup(1, {10, 11});
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    g->Arrive(0, Make(*g, 0, seq, seq, Collective::kAllReduce, seq * 100));
    g->Arrive(1, Make(*g, 1, seq, seq, Collective::kAllReduce, seq * 100));
  }
  EXPECT_EQ(engine_.launched(), 1) << "seq 2 must not be handed over before seq 1 is ordered";
  ASSERT_TRUE(engine_.LaunchNext());
  EXPECT_EQ(engine_.launched(), 2);
  ASSERT_TRUE(engine_.LaunchNext());
  ASSERT_TRUE(engine_.LaunchNext());
  EXPECT_FALSE(engine_.LaunchNext());
  EXPECT_EQ(engine_.pending(), 3u);
  for (uint64_t count : {100u, 200u, 300u}) EXPECT_EQ(engine_.Finish().count, count);
}

TEST_F(GroupTest, OutOfOrderArrivalWaitsForEarlierSequence) {
  auto g = NewGroup(1, {10, 11});
  g->Arrive(0, Make(*g, 0, 2, 2, Collective::kAllReduce, 222));
  g->Arrive(1, Make(*g, 1, 2, 2, Collective::kAllReduce, 222));
  EXPECT_EQ(engine_.pending(), 0u) << "seq 2 must wait for seq 1";
  g->Arrive(1, Make(*g, 1, 1, 1, Collective::kAllReduce, 111));
  EXPECT_EQ(engine_.pending(), 0u);
  g->Arrive(0, Make(*g, 0, 1, 1, Collective::kAllReduce, 111));
  ASSERT_EQ(engine_.pending(), 2u) << "both launched, in sequence order";
  EXPECT_EQ(engine_.Finish().count, 111u);
  ASSERT_EQ(engine_.pending(), 1u);
  EXPECT_EQ(engine_.Finish().count, 222u);
  EXPECT_TRUE(Result(10, 2)->ok());
  EXPECT_TRUE(Result(11, 1)->ok());
}

TEST_F(GroupTest, SequenceNobodySubmittedTimesOutInsteadOfBlockingLaterOps) {
  auto g = NewGroup(1, {10, 11});
  // Both members submit seq 2; nobody ever submits seq 1.
  g->Arrive(0, Make(*g, 0, 2, 2, Collective::kAllReduce, 222));
  g->Arrive(1, Make(*g, 1, 2, 2, Collective::kAllReduce, 222));
  const int64_t t0 = shm::NowNanos();
  g->CheckTimeouts(t0 + kTimeoutNs / 2);
  EXPECT_EQ(engine_.pending(), 0u) << "still within the timeout";
  g->CheckTimeouts(t0 + 2 * kTimeoutNs);
  ASSERT_EQ(engine_.pending(), 1u) << "seq 2 runs once seq 1 is given up";
  EXPECT_EQ(engine_.Finish().count, 222u);
  EXPECT_TRUE(Result(10, 2)->ok());
  // A late seq 1 gets the timeout, naming the sequence number.
  g->Arrive(0, Make(*g, 0, 1, 1));
  ASSERT_TRUE(Result(10, 1).has_value());
  EXPECT_EQ(Result(10, 1)->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(Result(10, 1)->message()), HasSubstr("seq 1"));
}

TEST_F(GroupTest, DuplicateSequenceIsRejected) {
  auto g = NewGroup(1, {10, 11});
  g->Arrive(0, Make(*g, 0, 1, 1));
  g->Arrive(0, Make(*g, 0, 2, 1));  // same seq again, new op id
  auto dup = Result(10, 2);
  ASSERT_TRUE(dup.has_value());
  EXPECT_EQ(dup->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup->message()), AllOf(HasSubstr("seq"), HasSubstr("twice"),
                                                 HasSubstr("rank 10")));
  // The first submission is still pending and completes normally.
  g->Arrive(1, Make(*g, 1, 1, 1));
  ASSERT_EQ(engine_.pending(), 1u);
  engine_.Finish();
  EXPECT_TRUE(Result(10, 1)->ok());
  // A sequence that already ran is rejected too.
  g->Arrive(0, Make(*g, 0, 3, 1));
  EXPECT_EQ(Result(10, 3)->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Result(10, 3)->message()), HasSubstr("already ran"));
}

struct DisagreementCase {
  const char* field;
  std::function<void(Arrival*)> mutate;
  Collective collective;
};

TEST_F(GroupTest, DisagreementFailsEveryMemberNamingRanksAndField) {
  const std::vector<DisagreementCase> cases = {
      {"count", [](Arrival* a) { a->desc.count = 9; }, Collective::kAllReduce},
      {"dtype", [](Arrival* a) { a->desc.dtype = uint8_t(DataType::kBFloat16); },
       Collective::kAllGather},
      {"reduce_op", [](Arrival* a) { a->desc.reduce_op = uint8_t(ReduceOp::kMax); },
       Collective::kReduceScatter},
      {"collective", [](Arrival* a) { a->desc.collective = uint8_t(Collective::kAllGather); },
       Collective::kAllReduce},
      {"root", [](Arrival* a) { a->desc.root = 1; }, Collective::kBroadcast},
      {"post_divide", [](Arrival* a) { a->desc.post_divide = 2; }, Collective::kAllReduce},
      {"reduce_dtype", [](Arrival* a) { a->desc.reduce_dtype = uint8_t(DataType::kFloat16); },
       Collective::kAllReduce},
  };
  uint32_t gid = 1;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    auto g = NewGroup(gid++, {10, 11, 12});
    g->Arrive(0, Make(*g, 0, gid * 10, 1, c.collective));
    g->Arrive(1, Make(*g, 1, gid * 10, 1, c.collective));
    Arrival odd = Make(*g, 2, gid * 10, 1, c.collective);
    c.mutate(&odd);
    g->Arrive(2, std::move(odd));
    EXPECT_EQ(engine_.pending(), 0u);
    for (int r : {10, 11, 12}) {
      auto s = Result(r, gid * 10);
      ASSERT_TRUE(s.has_value()) << "rank " << r;
      EXPECT_EQ(s->code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(s->message()),
                  AllOf(HasSubstr(c.field), HasSubstr("rank 10"), HasSubstr("rank 12"),
                        HasSubstr("disagree")));
    }
    // The group is not broken: the next sequence runs.
    for (int r = 0; r < 3; ++r) g->Arrive(r, Make(*g, r, gid * 10 + 1, 2));
    ASSERT_EQ(engine_.pending(), 1u);
    engine_.Finish();
    EXPECT_TRUE(Result(11, gid * 10 + 1)->ok());
  }
}

TEST_F(GroupTest, RejectedSubmissionFailsEveryMember) {
  auto g = NewGroup(1, {10, 11});
  g->Arrive(0, Make(*g, 0, 1, 1));
  Arrival bad = Make(*g, 1, 1, 1);
  bad.rejected = absl::InvalidArgumentError("recv.buffer_id: unknown buffer 9");
  g->Arrive(1, std::move(bad));
  for (int r : {10, 11}) {
    ASSERT_TRUE(Result(r, 1).has_value());
    EXPECT_EQ(Result(r, 1)->code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(Result(r, 1)->message()),
                AllOf(HasSubstr("rank 11"), HasSubstr("recv.buffer_id")));
  }
  EXPECT_EQ(engine_.pending(), 0u);
}

TEST_F(GroupTest, TimeoutNamesTheMissingRank) {
  auto g = NewGroup(1, {10, 11, 12});
  Arrival a0 = Make(*g, 0, 1, 1);
  Arrival a2 = Make(*g, 2, 1, 1);
  const int64_t t0 = a0.first_ns;
  g->Arrive(0, std::move(a0));
  g->Arrive(2, std::move(a2));
  g->CheckTimeouts(t0 + kTimeoutNs / 2);
  EXPECT_FALSE(Result(10, 1).has_value()) << "not yet expired";
  g->CheckTimeouts(t0 + 2 * kTimeoutNs);
  for (int r : {10, 12}) {
    ASSERT_TRUE(Result(r, 1).has_value());
    EXPECT_EQ(Result(r, 1)->code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(Result(r, 1)->message()),
                AllOf(HasSubstr("rank(s) [11]"), HasSubstr("arrived: [10, 12]")));
  }
  // The straggler's late submission gets the same answer at once.
  g->Arrive(1, Make(*g, 1, 1, 1));
  ASSERT_TRUE(Result(11, 1).has_value());
  EXPECT_EQ(Result(11, 1)->code(), absl::StatusCode::kDeadlineExceeded);
  // And the group moves on to seq 2.
  for (int r = 0; r < 3; ++r) g->Arrive(r, Make(*g, r, 2, 2));
  ASSERT_EQ(engine_.pending(), 1u);
  engine_.Finish();
  EXPECT_TRUE(Result(10, 2)->ok());
}

TEST_F(GroupTest, HugeRankListsAreSummarisedInMessages) {
  // A group of 200 ranks where only rank 10 is attached here: the timeout
  // names the missing ranks without listing all 199.
  for (int r = 4; r < 200; ++r) sessions_.push_back(MakeSession(100 + r, 10 + r, 300));
  std::vector<int> ranks;
  for (int r = 10; r < 210; ++r) ranks.push_back(r);
  auto g = NewGroup(9, ranks);
  Arrival a = Make(*g, 0, 1, 1);
  const int64_t t0 = a.first_ns;
  g->Arrive(0, std::move(a));
  g->CheckTimeouts(t0 + 2 * kTimeoutNs);
  ASSERT_TRUE(Result(10, 1).has_value());
  const std::string msg(Result(10, 1)->message());
  EXPECT_THAT(msg, HasSubstr("(183 more)]")) << msg;
  EXPECT_LT(msg.size(), 400u);
}

TEST_F(GroupTest, MemberLeftEndsTheEpochAndTheGroupReformsInTheNext) {
  auto g = NewGroup(1, {10, 11});
  g->Arrive(0, Make(*g, 0, 1, 1));
  g->Arrive(0, Make(*g, 0, 2, 2));
  g->MemberLeft(SessionOf(11).get(), "client process exited");
  for (uint64_t op : {1, 2}) {
    ASSERT_TRUE(Result(10, op).has_value());
    EXPECT_EQ(Result(10, op)->code(), absl::StatusCode::kAborted);
    EXPECT_THAT(std::string(Result(10, op)->message()),
                AllOf(HasSubstr("rank 11"), HasSubstr("client process exited"),
                      HasSubstr("epoch 1")));
  }
  EXPECT_TRUE(g->stats().broken);
  // Late work for the failed epoch gets the same error.
  g->Arrive(0, Make(*g, 0, 3, 3));
  ASSERT_TRUE(Result(10, 3).has_value());
  EXPECT_EQ(Result(10, 3)->code(), absl::StatusCode::kAborted);
  EXPECT_EQ(engine_.launched(), 0);
  // A session that is not a member changes nothing.
  const GroupStats before = g->stats();
  g->MemberLeft(SessionOf(13).get(), "unrelated");
  EXPECT_EQ(g->stats().ops_failed, before.ops_failed);
  EXPECT_EQ(g->stats().epoch, 1u);

  // Re-forming: the restarted rank (a new session) and the survivor join
  // epoch 2; the survivor may queue work for it before the group is whole.
  auto restarted = MakeSession(200, 11, 14);
  auto survivor_epoch = g->Join(0, SessionOf(10));
  ASSERT_TRUE(survivor_epoch.ok());
  EXPECT_EQ(*survivor_epoch, 2u);
  Arrival early = Make(*g, 0, 4, 1);
  early.epoch = early.desc.epoch = 2;
  g->Arrive(0, std::move(early));
  EXPECT_FALSE(Result(10, 4).has_value()) << "queued for epoch 2";
  EXPECT_EQ(g->stats().epoch, 1u);
  auto restarted_epoch = g->Join(1, restarted);
  ASSERT_TRUE(restarted_epoch.ok());
  EXPECT_EQ(*restarted_epoch, 2u);
  EXPECT_EQ(g->stats().epoch, 2u);
  EXPECT_FALSE(g->stats().broken);
  // Sequence numbers restart at 1 in the new epoch.
  Arrival late = Make(*g, 1, 1, 1);
  late.session = restarted;
  late.epoch = late.desc.epoch = 2;
  g->Arrive(1, std::move(late));
  ASSERT_EQ(engine_.pending(), 1u);
  EXPECT_EQ(engine_.front().epoch, 2u);
  EXPECT_EQ(engine_.front().seq, 1u);
  engine_.Finish();
  EXPECT_TRUE(Result(10, 4).value_or(absl::UnknownError("none")).ok());
  const shm::Completion* c = CompletionOf(*restarted, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(StatusOf(*c).ok());
  // The old epoch stays over.
  g->Arrive(0, Make(*g, 0, 5, 2));
  ASSERT_TRUE(Result(10, 5).has_value());
  EXPECT_EQ(Result(10, 5)->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(Result(10, 5)->message()), HasSubstr("epoch 1"));
}

// Found by the dispatcher fuzzer: a member queued work for the next epoch,
// then left before that epoch started; failing the (already failed) current
// epoch did not reach it, so its operation never completed.
TEST_F(GroupTest, WorkQueuedForTheNextEpochEndsWhenItsMemberLeaves) {
  auto g = NewGroup(1, {10, 11, 12});
  g->MemberLeft(SessionOf(11).get(), "client process exited");
  ASSERT_TRUE(g->stats().broken);
  ASSERT_EQ(*g->Join(0, SessionOf(10)), 2u);
  ASSERT_EQ(*g->Join(2, SessionOf(12)), 2u);
  for (int r : {0, 2}) {
    Arrival a = Make(*g, r, 7, 1);
    a.epoch = a.desc.epoch = 2;
    g->Arrive(r, std::move(a));
  }
  EXPECT_EQ(g->stats().pending, 1u);
  g->MemberLeft(SessionOf(12).get(), "killed");
  ASSERT_TRUE(Result(12, 7).has_value());
  EXPECT_EQ(Result(12, 7)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(12, 7)->message()),
              AllOf(HasSubstr("killed"), HasSubstr("before group 1"), HasSubstr("epoch 2")));
  // The other member's submission stays queued for epoch 2, and runs once
  // both others are back.
  EXPECT_FALSE(Result(10, 7).has_value());
  EXPECT_EQ(g->stats().pending, 1u);
  auto back11 = MakeSession(201, 11, 14);
  auto back12 = MakeSession(202, 12, 14);
  ASSERT_EQ(*g->Join(1, back11), 2u);
  ASSERT_EQ(*g->Join(2, back12), 2u);
  EXPECT_EQ(g->stats().epoch, 2u);
  for (auto [r, s] : {std::pair{1, back11}, std::pair{2, back12}}) {
    Arrival a = Make(*g, r, 1, 1);
    a.session = s;
    a.epoch = a.desc.epoch = 2;
    g->Arrive(r, std::move(a));
  }
  ASSERT_EQ(engine_.pending(), 1u);
  engine_.Finish();
  EXPECT_TRUE(Result(10, 7).value_or(absl::UnknownError("none")).ok());
}

TEST_F(GroupTest, CompleteWorkWaitingForAnEpochThatNeverStartsTimesOut) {
  // Rank 10 here (node 0), rank 11 on node 1, which is lost and never back:
  // the local member's submission for epoch 2 is complete here but can
  // never run, so it ends at the collective timeout naming who is missing.
  GroupSpec spec;
  spec.id = 1;
  spec.key = GroupKey(JobKey{0, "job"}, {10, 11}, 0);
  spec.job_id = "job";
  spec.ranks = {10, 11};
  spec.nodes = {0, 1};
  spec.this_node = 0;
  spec.timeout_ns = kTimeoutNs;
  spec.max_pending = 64;
  auto g = std::make_shared<Group>(std::move(spec), &engine_, nullptr);
  ASSERT_EQ(*g->Join(0, SessionOf(10)), 1u);
  g->PeerLost(1, "no heartbeat");
  ASSERT_TRUE(g->stats().broken);
  ASSERT_EQ(*g->Join(0, SessionOf(10)), 2u);
  Arrival a = Make(*g, 0, 3, 1);
  a.epoch = a.desc.epoch = 2;
  const int64_t t0 = a.first_ns;
  g->Arrive(0, std::move(a));
  g->CheckTimeouts(t0 + kTimeoutNs / 2);
  EXPECT_FALSE(Result(10, 3).has_value()) << "not yet expired";
  g->CheckTimeouts(t0 + 2 * kTimeoutNs);
  ASSERT_TRUE(Result(10, 3).has_value());
  EXPECT_EQ(Result(10, 3)->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(Result(10, 3)->message()),
              AllOf(HasSubstr("rank(s) [11]"), HasSubstr("to join epoch 2")));
  EXPECT_EQ(g->stats().pending, 0u);
  EXPECT_EQ(engine_.launched(), 0);
}

// A member rejoining the cluster without having heard of every node loses
// them all at once (Group::kEveryRemoteNode): the epoch fails naming every
// remote rank, and the group waits for each node to join again.
TEST_F(GroupTest, LosingEveryRemoteNodeFailsTheEpochForEveryRemoteRank) {
  GroupSpec spec;
  spec.id = 1;
  spec.key = GroupKey(JobKey{0, "job"}, {10, 11, 12}, 0);
  spec.job_id = "job";
  spec.ranks = {10, 11, 12};
  spec.nodes = {0, 1, 2};
  spec.this_node = 0;
  spec.timeout_ns = kTimeoutNs;
  spec.max_pending = 64;
  auto g = std::make_shared<Group>(std::move(spec), &engine_, nullptr);
  ASSERT_EQ(*g->Join(0, SessionOf(10)), 1u);
  Arrival a = Make(*g, 0, 4, 1);
  g->Arrive(0, std::move(a));
  EXPECT_FALSE(Result(10, 4).has_value());
  g->PeerLost(Group::kEveryRemoteNode, "this node joins again");
  ASSERT_TRUE(g->stats().broken);
  ASSERT_TRUE(Result(10, 4).has_value());
  EXPECT_EQ(Result(10, 4)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(10, 4)->message()),
              AllOf(HasSubstr("the nodes hosting rank(s) [11, 12] were lost"),
                    HasSubstr("this node joins again")));
  // The next epoch waits for both nodes: one back is not enough.
  ASSERT_EQ(*g->Join(0, SessionOf(10)), 2u);
  g->PeerJoined(1);
  EXPECT_EQ(g->stats().epoch, 1u);
  g->PeerJoined(2);
  EXPECT_EQ(g->stats().epoch, 2u);
}

TEST_F(GroupTest, MemberLeavingDuringExecutionAbortsTheRunningOp) {
  auto g = NewGroup(1, {10, 11});
  g->Arrive(0, Make(*g, 0, 1, 1));
  g->Arrive(1, Make(*g, 1, 1, 1));
  ASSERT_EQ(engine_.pending(), 1u);
  const uint64_t ticket = engine_.front_ticket();
  g->MemberLeft(SessionOf(11).get(), "gone");
  EXPECT_EQ(engine_.aborted(), std::vector<uint64_t>{ticket});
  EXPECT_EQ(engine_.pending(), 0u) << "the fake ends an aborted task, as NCCL abort does";
  ASSERT_TRUE(Result(10, 1).has_value());
  EXPECT_EQ(Result(10, 1)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(10, 1)->message()), HasSubstr("rank 11 left"));
}

TEST_F(GroupTest, RunningOpPastItsDeadlineIsAbortedAndEndsTheEpoch) {
  engine_.HoldLaunches(false);
  auto g = NewGroup(1, {10, 11});
  Arrival a0 = Make(*g, 0, 1, 1);
  const int64_t t0 = a0.first_ns;
  g->Arrive(0, std::move(a0));
  g->Arrive(1, Make(*g, 1, 1, 1));
  g->Arrive(0, Make(*g, 0, 2, 2));  // queued behind it, never matched
  ASSERT_EQ(engine_.pending(), 1u);
  const uint64_t ticket = engine_.front_ticket();
  g->CheckTimeouts(t0 + kTimeoutNs / 2);
  EXPECT_FALSE(Result(10, 1).has_value()) << "still within its deadline";
  // The transport hangs: the engine never completes the task by itself.
  g->CheckTimeouts(shm::NowNanos() + 2 * kTimeoutNs);
  for (int r : {10, 11}) {
    ASSERT_TRUE(Result(r, 1).has_value()) << "rank " << r;
    EXPECT_EQ(Result(r, 1)->code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(Result(r, 1)->message()),
                AllOf(HasSubstr("still running"), HasSubstr("aborted")));
  }
  EXPECT_EQ(engine_.aborted(), std::vector<uint64_t>{ticket});
  ASSERT_TRUE(Result(10, 2).has_value());
  EXPECT_FALSE(Result(10, 2)->ok());
  EXPECT_TRUE(g->stats().broken);
  EXPECT_EQ(g->stats().running, 0u);
}

TEST_F(GroupTest, JoinRefusesASecondLiveSessionForARank) {
  auto g = NewGroup(1, {10, 11});
  auto impostor = MakeSession(999, 11, 14);
  EXPECT_EQ(g->Join(1, impostor).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(g->Join(2, impostor).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g->IsMember(1, SessionOf(11).get()));
  EXPECT_FALSE(g->IsMember(1, impostor.get()));
  EXPECT_EQ(g->RankOf(11), 1);
  EXPECT_EQ(g->RankOf(13), -1);
}

TEST_F(GroupTest, PointToPointMatchesBySourceAndTagInPostingOrder) {
  auto g = NewGroup(1, {10, 11, 12});
  std::vector<std::vector<float>> mem(3, std::vector<float>(8, 0.0f));
  for (int r = 0; r < 3; ++r) mem[r][0] = float(r + 1);
  auto p2p = [&](int gr, uint64_t op_id, Collective c, int peer, int tag) {
    Arrival a = Make(*g, gr, op_id, 0, c, 4);
    a.desc.peer = peer;
    a.desc.tag = tag;
    a.send = mem[gr].data();
    a.recv = mem[gr].data() + 4;
    return a;
  };
  // Rank 0 posts a receive from any source, then one from rank 2 (tag 1).
  g->Arrive(0, p2p(0, 1, Collective::kRecv, kAnySource, 1));
  g->Arrive(0, p2p(0, 2, Collective::kRecv, 2, 1));
  EXPECT_EQ(engine_.pending(), 0u);
  // A send with another tag matches nothing.
  g->Arrive(2, p2p(2, 1, Collective::kSend, 0, 9));
  EXPECT_EQ(engine_.pending(), 0u);
  // Rank 2's tag-1 send matches the OLDER receive: the any-source one.
  g->Arrive(2, p2p(2, 2, Collective::kSend, 0, 1));
  ASSERT_EQ(engine_.pending(), 1u);
  EXPECT_EQ(engine_.front().members[0].global_rank, 12);
  EXPECT_EQ(engine_.front().members[1].global_rank, 10);
  ASSERT_TRUE(engine_.Execute().ok());
  const shm::Completion* c = CompletionOf(*SessionOf(10), 1);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(StatusOf(*c).ok());
  EXPECT_EQ(c->peer, 2) << "the receiver learns the source";
  EXPECT_EQ(mem[0][4], 3.0f) << "rank 12's data";
  EXPECT_TRUE(Result(12, 2).has_value());
  // Rank 1's send matches nothing (rank 0's remaining receive is from rank 2).
  g->Arrive(1, p2p(1, 1, Collective::kSend, 0, 1));
  EXPECT_EQ(engine_.pending(), 0u);
  // A member lost ends the epoch: every queued send and receive fails.
  g->MemberLeft(SessionOf(11).get(), "killed");
  for (auto [rank, op] : std::vector<std::pair<int, uint64_t>>{{10, 2}, {12, 1}, {11, 1}}) {
    ASSERT_TRUE(Result(rank, op).has_value()) << rank;
    EXPECT_EQ(Result(rank, op)->code(), absl::StatusCode::kAborted) << rank;
  }
}

TEST_F(GroupTest, UnmatchedPointToPointTimesOutNamingThePeer) {
  auto g = NewGroup(1, {10, 11});
  Arrival a = Make(*g, 0, 1, 0, Collective::kRecv, 4);
  a.desc.peer = 1;
  a.desc.tag = 3;
  const int64_t t0 = a.first_ns;
  g->Arrive(0, std::move(a));
  g->CheckTimeouts(t0 + kTimeoutNs / 2);
  EXPECT_FALSE(Result(10, 1).has_value());
  g->CheckTimeouts(t0 + 2 * kTimeoutNs);
  ASSERT_TRUE(Result(10, 1).has_value());
  EXPECT_EQ(Result(10, 1)->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(Result(10, 1)->message()),
              AllOf(HasSubstr("recv from rank 11"), HasSubstr("tag 3"), HasSubstr("timed out")));
}

TEST_F(GroupTest, CompositeForwardsSecondPhaseToReplicateGroup) {
  // 2x2 mesh: shard groups {10,11}, {12,13}; replicate groups {10,12}, {11,13}.
  auto s1 = NewGroup(1, {10, 11});
  auto s2 = NewGroup(2, {12, 13});
  auto r1 = NewGroup(3, {10, 12});
  auto r2 = NewGroup(4, {11, 13});
  auto composite = [&](Group& shard, int gr, uint32_t replicate_id, uint64_t op_id) {
    Arrival a = Make(shard, gr, op_id, 1, Collective::kReduceScatterAllReduce, 4);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kAvg);
    a.desc.pre_divide = 2.0;
    a.desc.post_divide = 3.0;
    a.desc.group2_id = replicate_id;
    a.desc.seq2 = 1;
    a.desc.epoch2 = 1;
    return a;
  };
  s1->Arrive(0, composite(*s1, 0, 3, 7));
  s1->Arrive(1, composite(*s1, 1, 4, 7));
  ASSERT_EQ(engine_.pending(), 1u);
  {
    const EngineTask rs = engine_.front();
    EXPECT_EQ(rs.collective, Collective::kReduceScatter);
    EXPECT_EQ(rs.priority, 0) << "reduce-scatter runs at high priority";
    EXPECT_EQ(rs.spec.op, ReduceOp::kSum) << "AVG divides once, in phase 2";
    EXPECT_EQ(rs.spec.pre_divide, 2.0);
    EXPECT_EQ(rs.spec.post_divide, 1.0);
  }
  // Phase 2 is forwarded as soon as phase 1 is launched; it waits in the
  // replicate groups for the other shard group's members.
  EXPECT_EQ(r1->stats().pending, 1u);
  EXPECT_EQ(r2->stats().pending, 1u);
  engine_.Finish();
  EXPECT_FALSE(Result(10, 7).has_value()) << "phase 1 alone does not complete the op";
  EXPECT_EQ(engine_.pending(), 0u) << "phase 2 waits for the other shard group";
  s2->Arrive(0, composite(*s2, 0, 3, 9));
  s2->Arrive(1, composite(*s2, 1, 4, 9));
  ASSERT_EQ(engine_.pending(), 3u);  // shard group 2's reduce-scatter and both all-reduces
  engine_.Finish();  // shard group 2's reduce-scatter
  ASSERT_EQ(engine_.pending(), 2u);  // both replicate all-reduces
  for (int i = 0; i < 2; ++i) {
    const EngineTask ar = engine_.front();
    EXPECT_EQ(ar.collective, Collective::kAllReduce);
    EXPECT_EQ(ar.priority, 1);
    EXPECT_EQ(ar.spec.op, ReduceOp::kSum);
    EXPECT_EQ(ar.spec.pre_divide, 1.0);
    EXPECT_DOUBLE_EQ(ar.spec.post_divide, 3.0 * 4);  // post_divide x mesh size for AVG
    ASSERT_EQ(ar.members.size(), 2u);
    // In place on each member's phase-1 output.
    EXPECT_EQ(ar.members[0].send.data, ar.members[0].recv.data);
    EXPECT_EQ(ar.members[1].send.data, ar.members[1].recv.data);
    EXPECT_EQ(ar.depends_on.size(), 2u) << "after both shard groups' reduce-scatters";
    engine_.Finish();
  }
  EXPECT_TRUE(Result(10, 7).value_or(absl::UnknownError("none")).ok());
  EXPECT_TRUE(Result(11, 7).value_or(absl::UnknownError("none")).ok());
  EXPECT_TRUE(Result(12, 9).value_or(absl::UnknownError("none")).ok());
  EXPECT_TRUE(Result(13, 9).value_or(absl::UnknownError("none")).ok());
}

TEST_F(GroupTest, CompositeFirstPhaseFailureReachesEveryMember) {
  auto s1 = NewGroup(1, {10, 11});
  auto s2 = NewGroup(2, {12, 13});
  auto r1 = NewGroup(3, {10, 12});
  auto r2 = NewGroup(4, {11, 13});
  auto composite = [&](Group& shard, int gr, uint32_t replicate_id, uint64_t op_id,
                       uint64_t count) {
    Arrival a = Make(shard, gr, op_id, 1, Collective::kReduceScatterAllReduce, count);
    a.desc.group2_id = replicate_id;
    a.desc.seq2 = 1;
    a.desc.epoch2 = 1;
    return a;
  };
  // Shard group 1 disagrees on count; shard group 2 is fine.
  s1->Arrive(0, composite(*s1, 0, 3, 7, 4));
  s1->Arrive(1, composite(*s1, 1, 4, 7, 5));
  s2->Arrive(0, composite(*s2, 0, 3, 9, 4));
  s2->Arrive(1, composite(*s2, 1, 4, 9, 4));
  ASSERT_EQ(engine_.pending(), 1u);
  engine_.Finish();
  EXPECT_EQ(engine_.pending(), 0u);
  for (auto [rank, op] : std::vector<std::pair<int, uint64_t>>{{10, 7}, {11, 7}, {12, 9}, {13, 9}}) {
    auto s = Result(rank, op);
    ASSERT_TRUE(s.has_value()) << "rank " << rank;
    EXPECT_FALSE(s->ok()) << "rank " << rank;
  }
  EXPECT_THAT(std::string(Result(12, 9)->message()), HasSubstr("count"));
}

}  // namespace
}  // namespace hsdp
