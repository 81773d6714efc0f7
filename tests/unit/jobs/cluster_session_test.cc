// SessionManager in a cluster, without processes: two simulated daemons
// (a SessionManager, a FakeStreamEngine joined by a FakeFabric, and a
// FakeClusterDirectory over one shared placement state each). Placement
// conflicts, hostile rank lists refused before any network call, groups
// that span nodes (non-contiguous ranks) running once on both, a trainer
// leaving on one node failing the epoch on the other naming it, both
// daemons re-forming the group in the same next epoch, a lost node's ranks
// kept out until it joins again, a re-created group starting in line, and
// point-to-point between nodes.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/session_manager.h"
#include "fake_cluster_directory.h"
#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::CompletionOf;
using testing::FakeClusterDirectory;
using testing::FakeClusterState;
using testing::StatusOf;

constexpr int kCount = 16;

class ClusterSessionTest : public ::testing::Test {
 protected:
  struct Node {
    Node(int id, FakeFabric* fabric, FakeClusterState* state)
        : engine(id, fabric), dir(state, id) {}
    FakeStreamEngine engine;
    FakeClusterDirectory dir;
    std::unique_ptr<SessionManager> sm;
    std::map<int, uint64_t> sid;                // by global rank
    std::map<int, std::vector<float>> mem;      // send then recv, by global rank
  };

  void SetUp() override {
    config_.cluster_join_timeout_ms = join_timeout_ms_;
    NodeLimits limits;
    limits.max_node_bytes = 1 << 30;
    limits.max_mappings = 100;
    for (int n = 0; n < 2; ++n) {
      nodes_.push_back(std::make_unique<Node>(n, &fabric_, &state_));
      nodes_[n]->sm = std::make_unique<SessionManager>(config_, limits, &nodes_[n]->engine,
                                                       nullptr, nullptr, &nodes_[n]->dir);
      state_.managers[n] = nodes_[n]->sm.get();
    }
  }

  static PeerCred Cred(uid_t uid = 1000) { return PeerCred{1, uid, uid}; }

  absl::StatusOr<uint64_t> TryAttach(int node, int rank, int world, const std::string& job = "j",
                                     uid_t uid = 1000) {
    AttachParams p;
    p.job_id = job;
    p.rank = rank;
    p.world_size = world;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented;
    absl::StatusOr<AttachResult> r = nodes_[node]->sm->Attach(p, Cred(uid));
    if (!r.ok()) return r.status();
    EXPECT_TRUE(nodes_[node]->sm->ClaimSession(r->session_id, r->token.data(), Cred(uid)).ok());
    nodes_[node]->sid[rank] = r->session_id;
    nodes_[node]->mem[rank] = std::vector<float>(2 * kCount, 0.0f);
    return r->session_id;
  }
  void Attach(int node, int rank, int world) { ASSERT_TRUE(TryAttach(node, rank, world).ok()); }

  absl::StatusOr<NewGroupResult> NewGroup(int node, int rank, const std::vector<int>& ranks,
                                          uint32_t rejoin = 0) {
    return nodes_[node]->sm->NewGroup(nodes_[node]->sid.at(rank), ranks, Cred(), rejoin);
  }
  // NewGroup of session `sid`, owned by `uid`, with its caller's `gone` flag.
  absl::StatusOr<NewGroupResult> NewGroupOf(uint64_t sid, uid_t uid, const std::vector<int>& ranks,
                                            std::function<bool()> gone = nullptr) {
    return nodes_[0]->sm->NewGroup(sid, ranks, Cred(uid), 0, std::move(gone));
  }
  // Waits (bounded) until `n` Resolve calls are in progress.
  bool ResolvingReaches(int n) {
    absl::MutexLock l(&state_.mu);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu) { return state_.resolving == n; };
    return state_.mu.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }

  int join_timeout_ms_ = 300;

  // Rank `rank` on `node` submits an all-reduce (input rank + i) or a send / recv.
  void Submit(int node, int rank, uint32_t gid, uint64_t op_id, uint64_t seq, uint32_t epoch,
              Collective c = Collective::kAllReduce, int peer = 0, int tag = 0) {
    Node& n = *nodes_[node];
    std::shared_ptr<Group> g = n.sm->FindGroup(gid);
    ASSERT_NE(g, nullptr);
    std::vector<float>& m = n.mem[rank];
    for (int i = 0; i < kCount; ++i) m[i] = static_cast<float>(rank * 100 + i);
    Arrival a;
    a.session = n.sm->FindSession(n.sid.at(rank));
    a.desc.op_id = op_id;
    a.desc.seq = seq;
    a.desc.epoch = epoch;
    a.desc.collective = static_cast<uint8_t>(c);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    a.desc.count = kCount;
    a.desc.peer = peer;
    a.desc.tag = tag;
    a.desc.premul_factor = a.desc.pre_divide = a.desc.post_divide = 1.0;
    a.desc.group_id = gid;
    a.epoch = epoch;
    a.seq = seq;
    a.send = m.data();
    a.recv = c == Collective::kRecv ? m.data() : m.data() + kCount;
    a.first_ns = shm::NowNanos();
    g->Arrive(g->RankOf(rank), std::move(a));
  }

  std::optional<absl::Status> Result(int node, int rank, uint64_t op_id) {
    Node& n = *nodes_[node];
    std::shared_ptr<Session> s = n.sm->FindSession(n.sid.at(rank));
    if (s == nullptr) return std::nullopt;
    const shm::Completion* c = CompletionOf(*s, op_id);
    if (c == nullptr) return std::nullopt;
    return StatusOf(*c);
  }

  // Ranks 0, 3 on node 0 and 1, 2 on node 1; group {0, 1, 2, 3} on both.
  void FormFour(uint32_t* gid0, uint32_t* gid1) {
    Attach(0, 0, 4);
    Attach(0, 3, 4);
    Attach(1, 1, 4);
    Attach(1, 2, 4);
    for (auto [node, rank] : {std::pair{0, 0}, {0, 3}, {1, 1}, {1, 2}}) {
      absl::StatusOr<NewGroupResult> r = NewGroup(node, rank, {0, 1, 2, 3});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->epoch, 1u);
      *(node == 0 ? gid0 : gid1) = r->group_id;
    }
  }

  NodeConfig config_;
  FakeFabric fabric_;
  FakeClusterState state_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(ClusterSessionTest, ConflictingWorldSizeOrARankOnTwoNodesIsAClearError) {
  Attach(0, 0, 4);
  absl::StatusOr<uint64_t> twice = TryAttach(1, 0, 4);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(twice.status().message()),
              AllOf(HasSubstr("rank 0"), HasSubstr("node 0")));
  absl::StatusOr<uint64_t> world = TryAttach(1, 1, 8);
  ASSERT_FALSE(world.ok());
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(world.status().message()), HasSubstr("world size 4"));
  EXPECT_TRUE(TryAttach(1, 1, 4).ok());
}

TEST_F(ClusterSessionTest, HostileRankListsAreRefusedBeforeAnyNetworkCall) {
  Attach(0, 0, 4);
  int before;
  {
    absl::MutexLock l(&state_.mu);
    before = state_.network_calls;
  }
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{
           {0, 4}, {0, -1}, {0, 1, 1}, {1, 2}, {}, {0, 1, 2, 3, 0}}) {
    absl::StatusOr<NewGroupResult> r = NewGroup(0, 0, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad.size();
  }
  absl::MutexLock l(&state_.mu);
  EXPECT_EQ(state_.network_calls, before);
}

TEST_F(ClusterSessionTest, NewGroupWaitsForPlacementWithADeadline) {
  Attach(0, 0, 2);
  absl::StatusOr<NewGroupResult> r = NewGroup(0, 0, {0, 1});  // rank 1 never attaches
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Waits are bounded per node (each holds a gRPC thread) and shared per uid:
// one user's waits take at most its share (limits.uid_share_percent, 50% by
// default: 8 of 16), so another user's groups still get placed.
TEST_F(ClusterSessionTest, PlacementWaitsAreBoundedAndSharedPerUid) {
  const absl::StatusOr<uint64_t> a = TryAttach(0, 0, 64, "job-a", 1000);
  const absl::StatusOr<uint64_t> b = TryAttach(0, 0, 64, "job-b", 1001);
  const absl::StatusOr<uint64_t> c = TryAttach(0, 0, 64, "job-c", 1002);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  {
    absl::MutexLock l(&state_.mu);
    state_.hold_resolve = true;
  }
  std::vector<std::thread> waiting;
  std::vector<absl::StatusCode> codes(16);
  for (int i = 0; i < 8; ++i) {
    waiting.emplace_back([&, i] { codes[i] = NewGroupOf(*a, 1000, {0, 1 + i}).status().code(); });
  }
  ASSERT_TRUE(ResolvingReaches(8));
  // uid 1000 holds its whole share: its next wait is refused, naming the share ...
  absl::StatusOr<NewGroupResult> over = NewGroupOf(*a, 1000, {0, 40});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), AllOf(HasSubstr("uid 1000"), HasSubstr("share of 8"),
                                             HasSubstr("limits.uid_share_percent")));
  // ... while uid 1001 still gets the rest of the node's waits.
  for (int i = 8; i < 16; ++i) {
    waiting.emplace_back([&, i] { codes[i] = NewGroupOf(*b, 1001, {0, 1 + i}).status().code(); });
  }
  ASSERT_TRUE(ResolvingReaches(16));
  // Now the node's 16 are taken: a third uid is refused by the node's bound.
  absl::StatusOr<NewGroupResult> full = NewGroupOf(*c, 1002, {0, 41});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("used up: 16 of 16"));
  {
    absl::MutexLock l(&state_.mu);
    state_.hold_resolve = false;
  }
  for (std::thread& t : waiting) t.join();
  for (absl::StatusCode code : codes) EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
  // The waits are free again.
  EXPECT_EQ(NewGroupOf(*a, 1000, {0, 42}).status().code(), absl::StatusCode::kDeadlineExceeded);
}

class ClusterSessionLongWaitTest : public ClusterSessionTest {
 protected:
  ClusterSessionLongWaitTest() { join_timeout_ms_ = 600000; }
};

// A wait whose caller went away (its RPC cancelled, or its session ended)
// ends then, not at cluster.join_timeout_ms (10 minutes here), and gives its
// place back at once.
TEST_F(ClusterSessionLongWaitTest, APlacementWaitEndsWhenItsCallerGoes) {
  const absl::StatusOr<uint64_t> a = TryAttach(0, 0, 64, "job-a", 1000);
  ASSERT_TRUE(a.ok());
  std::atomic<bool> gone{false};
  absl::StatusOr<NewGroupResult> cancelled_result;
  std::thread cancelled_call([&] {
    cancelled_result = NewGroupOf(*a, 1000, {0, 1}, [&] { return gone.load(); });
  });
  std::vector<absl::StatusCode> ended(7, absl::StatusCode::kOk);
  std::vector<std::thread> session_calls;
  for (int i = 0; i < 7; ++i) {
    session_calls.emplace_back(
        [&, i] { ended[i] = NewGroupOf(*a, 1000, {0, 2 + i}).status().code(); });
  }
  ASSERT_TRUE(ResolvingReaches(8));
  gone = true;  // the caller's RPC was cancelled
  cancelled_call.join();
  EXPECT_EQ(cancelled_result.status().code(), absl::StatusCode::kCancelled)
      << cancelled_result.status();
  EXPECT_TRUE(ResolvingReaches(7));
  // The session of the other seven ends: they end too.
  ASSERT_TRUE(nodes_[0]->sm->Detach(*a, Cred(1000)).ok());
  for (std::thread& t : session_calls) t.join();
  for (absl::StatusCode code : ended) EXPECT_EQ(code, absl::StatusCode::kCancelled);
  EXPECT_TRUE(ResolvingReaches(0));
  // Their places are free: uid 1000 may wait again, up to its share.
  const absl::StatusOr<uint64_t> again = TryAttach(0, 0, 64, "job-a2", 1000);
  ASSERT_TRUE(again.ok());
  gone = false;
  std::thread one([&] {
    EXPECT_EQ(NewGroupOf(*again, 1000, {0, 1}, [&] { return gone.load(); }).status().code(),
              absl::StatusCode::kCancelled);
  });
  ASSERT_TRUE(ResolvingReaches(1));
  gone = true;
  one.join();
}

TEST_F(ClusterSessionTest, GroupAcrossNodesRunsOnceOnBothWithNonContiguousRanks) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  EXPECT_TRUE(nodes_[0]->sm->FindGroup(g0)->spans_nodes());
  EXPECT_EQ(nodes_[0]->sm->FindGroup(g0)->nodes(), (std::vector<int>{0, 1, 1, 0}));
  Submit(0, 0, g0, 1, 1, 1);
  Submit(0, 3, g0, 1, 1, 1);
  Submit(1, 1, g1, 1, 1, 1);
  EXPECT_EQ(fabric_.RunReady(), 0);  // rank 2 has not submitted
  Submit(1, 2, g1, 1, 1, 1);
  EXPECT_EQ(fabric_.RunReady(), 1);
  for (auto [node, rank] : {std::pair{0, 0}, {0, 3}, {1, 1}, {1, 2}}) {
    ASSERT_TRUE(Result(node, rank, 1).has_value()) << rank;
    EXPECT_TRUE(Result(node, rank, 1)->ok()) << *Result(node, rank, 1);
    const std::vector<float>& m = nodes_[node]->mem[rank];
    for (int i = 0; i < kCount; ++i) {
      ASSERT_EQ(m[kCount + i], 600.0f + 4 * i) << "rank " << rank << " element " << i;
    }
  }
  // A group only on node 1 stays a single-node group there.
  absl::StatusOr<NewGroupResult> local = NewGroup(1, 1, {2, 1});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(nodes_[1]->sm->FindGroup(local->group_id)->spans_nodes());
}

TEST_F(ClusterSessionTest, TrainerLeavingFailsTheEpochOnTheOtherNodeNamingTheRank) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  Submit(0, 0, g0, 1, 1, 1);
  Submit(0, 3, g0, 1, 1, 1);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);  // launched, waiting for node 1
  nodes_[1]->sm->EndSession(nodes_[1]->sid[1], "data connection closed");
  EXPECT_EQ(state_.Deliver(), 1);
  for (int rank : {0, 3}) {
    ASSERT_TRUE(Result(0, rank, 1).has_value()) << rank;
    EXPECT_EQ(Result(0, rank, 1)->code(), absl::StatusCode::kAborted);
    EXPECT_THAT(std::string(Result(0, rank, 1)->message()),
                AllOf(HasSubstr("node 1"), HasSubstr("rank 1 left")));
  }
  EXPECT_EQ(nodes_[0]->engine.aborted().size(), 1u);
  EXPECT_TRUE(nodes_[0]->sm->FindGroup(g0)->stats().broken);

  // Rank 1 comes back; every member joins again, and both daemons run epoch 2.
  Attach(1, 1, 4);
  absl::StatusOr<NewGroupResult> back = NewGroup(1, 1, {0, 1, 2, 3});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch, 2u);
  ASSERT_TRUE(NewGroup(1, 2, {}, g1).ok());
  ASSERT_TRUE(NewGroup(0, 0, {}, g0).ok());
  absl::StatusOr<NewGroupResult> last = NewGroup(0, 3, {}, g0);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->epoch, 2u);
  EXPECT_EQ(nodes_[0]->sm->FindGroup(g0)->epoch(), 2u) << "remote ranks join implicitly";
  EXPECT_EQ(nodes_[1]->sm->FindGroup(g1)->epoch(), 2u);
  for (auto [node, rank] : {std::pair{0, 0}, {0, 3}, {1, 1}, {1, 2}}) {
    Submit(node, rank, node == 0 ? g0 : g1, 2, 1, 2);
  }
  EXPECT_EQ(fabric_.RunReady(), 1);
  EXPECT_TRUE(Result(1, 1, 2).value_or(absl::UnknownError("none")).ok());
  EXPECT_TRUE(Result(0, 3, 2).value_or(absl::UnknownError("none")).ok());
  EXPECT_EQ(state_.Deliver(), 0) << "nothing else failed";
}

TEST_F(ClusterSessionTest, AMemberThatNeverSubmitsEndsTheEpochOnEveryNode) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  Submit(0, 0, g0, 1, 1, 1);  // rank 3 (node 0) never submits; node 1's ranks do
  Submit(1, 1, g1, 1, 1, 1);
  Submit(1, 2, g1, 1, 1, 1);
  ASSERT_EQ(nodes_[1]->engine.pending(), 1u);  // node 1 runs it, waiting for node 0
  nodes_[0]->sm->FindGroup(g0)->CheckTimeouts(
      shm::NowNanos() + int64_t{config_.collective_timeout_ms + 1000} * 1'000'000);
  ASSERT_TRUE(Result(0, 0, 1).has_value());
  EXPECT_EQ(Result(0, 0, 1)->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(state_.Deliver(), 1);
  for (int rank : {1, 2}) {
    ASSERT_TRUE(Result(1, rank, 1).has_value()) << rank;
    EXPECT_THAT(std::string(Result(1, rank, 1)->message()),
                AllOf(HasSubstr("node 0 reports"), HasSubstr("rank(s) [3]")));
  }
  EXPECT_EQ(nodes_[1]->engine.pending(), 0u) << "aborted, not left to its deadline";
}

TEST_F(ClusterSessionTest, ALostNodesRanksStayOutUntilItJoinsAgain) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  Submit(0, 0, g0, 1, 1, 1);
  nodes_[0]->sm->OnPeerLost(1, "no heartbeat");
  ASSERT_TRUE(Result(0, 0, 1).has_value());
  EXPECT_THAT(std::string(Result(0, 0, 1)->message()),
              AllOf(HasSubstr("node 1"), HasSubstr("[1, 2]")));
  ASSERT_TRUE(NewGroup(0, 0, {}, g0).ok());
  ASSERT_TRUE(NewGroup(0, 3, {}, g0).ok());
  EXPECT_EQ(nodes_[0]->sm->FindGroup(g0)->epoch(), 1u) << "node 1 is still lost";
  nodes_[0]->sm->OnPeerJoined(1);
  EXPECT_EQ(nodes_[0]->sm->FindGroup(g0)->epoch(), 2u);
  // The survivor reported the failed epoch, so a group node 1 creates anew
  // (after a restart) starts in epoch 2 too.
  absl::MutexLock l(&state_.mu);
  EXPECT_EQ(state_.first_epoch[nodes_[0]->sm->FindGroup(g0)->key()], 2u);
}

TEST_F(ClusterSessionTest, AnEpochReportedFailedAheadFailsOnArrival) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  std::shared_ptr<Group> g = nodes_[0]->sm->FindGroup(g0);
  nodes_[0]->sm->OnGroupEvent(g->key(), 2, 1, "rank 2 left the job");  // epoch 2 is ahead
  EXPECT_FALSE(g->stats().broken);
  nodes_[0]->sm->OnGroupEvent(g->key(), 1, 1, "rank 1 left the job");
  EXPECT_TRUE(g->stats().broken);
  ASSERT_TRUE(NewGroup(0, 0, {}, g0).ok());
  ASSERT_TRUE(NewGroup(0, 3, {}, g0).ok());
  EXPECT_EQ(g->epoch(), 2u);
  EXPECT_TRUE(g->stats().broken) << "epoch 2 had already failed on node 1";
  nodes_[0]->sm->OnGroupEvent("some other key", 1, 1, "ignored");
}

TEST_F(ClusterSessionTest, AGroupCreatedAgainStartsInLineWithTheOtherNodes) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  // Both trainers of node 1 end: node 1 forgets the job and its groups.
  nodes_[1]->sm->EndSession(nodes_[1]->sid[1], "killed");
  nodes_[1]->sm->EndSession(nodes_[1]->sid[2], "killed");
  state_.Deliver();
  Attach(1, 1, 4);
  Attach(1, 2, 4);
  absl::StatusOr<NewGroupResult> r = NewGroup(1, 1, {0, 1, 2, 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, 2u) << "node 0's group continues in epoch 2";
}

TEST_F(ClusterSessionTest, SendAndRecvAcrossNodesPairInPostingOrder) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  // Rank 0 (node 0) sends twice to rank 1 (node 1) with tag 5; the k-th
  // send pairs with the k-th receive.
  Submit(0, 0, g0, 10, 0, 1, Collective::kSend, /*peer=*/1, 5);
  Submit(1, 1, g1, 10, 0, 1, Collective::kRecv, /*peer=*/0, 5);
  EXPECT_EQ(fabric_.RunReady(), 1);
  EXPECT_TRUE(Result(0, 0, 10).value_or(absl::UnknownError("none")).ok());
  ASSERT_TRUE(Result(1, 1, 10).value_or(absl::UnknownError("none")).ok());
  EXPECT_EQ(nodes_[1]->mem[1][3], 3.0f);  // rank 0's data
  // A receive from any source cannot be matched across nodes.
  Submit(1, 2, g1, 11, 0, 1, Collective::kRecv, kAnySource, 5);
  ASSERT_TRUE(Result(1, 2, 11).has_value());
  EXPECT_EQ(Result(1, 2, 11)->code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(Result(1, 2, 11)->message()), HasSubstr("spans nodes"));
}


TEST_F(ClusterSessionTest, PointToPointStreamsBetweenNodesAreBoundedAndReleased) {
  uint32_t g0 = 0, g1 = 0;
  FormFour(&g0, &g1);
  const size_t limit = Group::kMaxRemoteP2PStreams;
  for (size_t tag = 0; tag < limit; ++tag) {
    Submit(0, 0, g0, 100 + tag, 0, 1, Collective::kSend, /*peer=*/1, static_cast<int>(tag));
  }
  EXPECT_EQ(nodes_[0]->engine.pending(), limit);  // launched, waiting for node 1
  // Another send on an existing (source, destination, tag) is fine; a new tag is not.
  Submit(0, 0, g0, 100 + limit, 0, 1, Collective::kSend, 1, 0);
  EXPECT_FALSE(Result(0, 0, 100 + limit).has_value());
  Submit(0, 0, g0, 101 + limit, 0, 1, Collective::kSend, 1, static_cast<int>(limit));
  ASSERT_TRUE(Result(0, 0, 101 + limit).has_value());
  EXPECT_EQ(Result(0, 0, 101 + limit)->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(nodes_[0]->sm->FindGroup(g0)->engine_keys().size(), limit + 1);
  // The epoch ends (rank 3 leaves): every one of them is aborted in the engine.
  nodes_[0]->sm->EndSession(nodes_[0]->sid[3], "killed");
  EXPECT_EQ(nodes_[0]->engine.pending(), 0u);
  EXPECT_EQ(Result(0, 0, 100)->code(), absl::StatusCode::kAborted);
}

// A job's last session here ending keeps its cross-node group's engine state
// (retired_groups) until twice the heartbeat plus 500 ms has passed on the
// manager's clock; Housekeeping then destroys it, not a nanosecond earlier.
TEST_F(ClusterSessionTest, RetiredCrossNodeStateGoesWhenItsTimeHasPassed) {
  FakeClock clock;
  config_.cluster_heartbeat_ms = 1000;  // due 2.5 s after the job ended
  NodeLimits limits;
  limits.max_node_bytes = 1 << 30;
  limits.max_mappings = 100;
  for (int n = 0; n < 2; ++n) {
    nodes_[n]->sm = std::make_unique<SessionManager>(config_, limits, &nodes_[n]->engine, nullptr,
                                                     nullptr, &nodes_[n]->dir, &clock);
    state_.managers[n] = nodes_[n]->sm.get();
  }
  uint32_t gid0 = 0, gid1 = 0;
  FormFour(&gid0, &gid1);
  SessionManager& sm = *nodes_[0]->sm;
  ASSERT_GT(nodes_[0]->engine.created_groups(), 0);
  EXPECT_EQ(sm.retired_groups(), 0u);
  sm.EndSession(nodes_[0]->sid.at(0), "test");
  EXPECT_EQ(sm.retired_groups(), 0u) << "the job still has rank 3 here";
  sm.EndSession(nodes_[0]->sid.at(3), "test");
  EXPECT_EQ(sm.retired_groups(), 1u);
  EXPECT_GT(nodes_[0]->engine.created_groups(), 0) << "kept while the others learn why";
  clock.Advance(2'500'000'000 - 1);
  sm.Housekeeping();
  EXPECT_EQ(sm.retired_groups(), 1u);
  EXPECT_GT(nodes_[0]->engine.created_groups(), 0);
  clock.Advance(1);
  sm.Housekeeping();
  EXPECT_EQ(sm.retired_groups(), 0u);
  EXPECT_EQ(nodes_[0]->engine.created_groups(), 0);
}

}  // namespace
}  // namespace hsdp
