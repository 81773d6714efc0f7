// The group model against the fakes that stand for what comes next: two
// "daemons" (a Group and a FakeStreamEngine each) joined by a FakeFabric, so
// one group has local and remote members; stream-ordered launches; a node
// lost mid-operation; and the composite pipelined across two stream-ordered
// phases. Data really moves (host memory), and every outcome is checked.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/dataplane/group.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/engine/peer_instances.h"
#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::CompletionOf;
using testing::MakeSession;
using testing::StatusOf;

constexpr int64_t kTimeoutNs = 1'000'000'000;

// The fake engine, also telling which instance of each peer node's daemon
// the links reach (what the rendezvous tells the real engine): as the test
// sets it, for every group and epoch.
class LinkedFakeEngine : public FakeStreamEngine, public PeerInstances {
 public:
  using FakeStreamEngine::FakeStreamEngine;
  void Link(int node, const std::string& instance) {
    absl::MutexLock l(&mu_);
    linked_[node] = instance;
  }
  std::vector<std::string> LinkedInstances(const std::string&, uint32_t, int node) const override {
    absl::MutexLock l(&mu_);
    auto it = linked_.find(node);
    if (it == linked_.end()) return {};
    return {it->second};
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int, std::string> linked_ ABSL_GUARDED_BY(mu_);
};

// One simulated node: its engine, sessions and groups.
struct Node {
  Node(int id, FakeFabric* fabric) : engine(id, fabric), node(id) {}
  LinkedFakeEngine engine;
  int node;
  std::map<int, std::shared_ptr<Session>> sessions;  // by global rank
  std::map<uint32_t, std::shared_ptr<Group>> groups;
  std::map<int, std::vector<float>> mem;  // by global rank: send then recv
};

class CrossNodeTest : public ::testing::Test {
 protected:
  // Global ranks 0..3: ranks 0, 2 on node 0 and 1, 3 on node 1 (not contiguous).
  void SetUp() override {
    for (int n = 0; n < 2; ++n) nodes_.push_back(std::make_unique<Node>(n, &fabric_));
    for (int r = 0; r < 4; ++r) {
      Node& n = *nodes_[NodeOf(r)];
      n.sessions[r] = MakeSession(100 + r, r, 4);
      n.mem[r] = std::vector<float>(64, 0.0f);
    }
    fabric_.OnNodeLost([this](int node, const std::string& why) {
      for (auto& n : nodes_) {
        for (auto& [id, g] : n->groups) g->PeerLost(node, why);
      }
    });
  }

  static int NodeOf(int rank) { return rank % 2; }

  // The same group, as each node's daemon sees it.
  // Epoch failures each node's group reports (spec.on_epoch_failed), by node.
  std::map<int, std::vector<std::pair<uint32_t, std::string>>> reported_;
  std::map<int, std::vector<uint64_t>> reported_seq_;  // the completed_seq of each

  void MakeGroup(uint32_t id, const std::vector<int>& ranks) {
    for (auto& n : nodes_) MakeGroupOn(*n, id, ranks);
  }

  // The group as node `n`'s daemon creates it, starting in `first_epoch`
  // (what a daemon that restarted reads from the cluster), its local members
  // joined.
  void MakeGroupOn(Node& n, uint32_t id, const std::vector<int>& ranks,
                   uint32_t first_epoch = 1) {
    std::vector<int> nodes;
    for (int r : ranks) nodes.push_back(NodeOf(r));
    GroupSpec spec;
    spec.id = id;
    spec.key = GroupKey(JobKey{0, "job"}, ranks, 0);
    spec.job_id = "job";
    spec.ranks = ranks;
    spec.nodes = nodes;
    spec.this_node = n.node;
    spec.first_epoch = first_epoch;
    spec.timeout_ns = kTimeoutNs;
    spec.max_pending = 64;
    spec.on_epoch_failed = [this, node = n.node](uint32_t epoch, const absl::Status& why,
                                                 uint64_t completed_seq) {
      reported_[node].emplace_back(epoch, std::string(why.message()));
      reported_seq_[node].push_back(completed_seq);
    };
    Node* np = &n;
    auto g = std::make_shared<Group>(std::move(spec), &n.engine,
                                     [np](uint32_t gid) -> std::shared_ptr<Group> {
                                       auto it = np->groups.find(gid);
                                       return it == np->groups.end() ? nullptr : it->second;
                                     });
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (NodeOf(ranks[i]) != n.node) continue;
      ASSERT_EQ(g->Join(static_cast<int>(i), n.sessions[ranks[i]]).value_or(0), first_epoch);
    }
    n.groups[id] = g;
  }

  // Node `node`'s daemon is replaced by a new one (its sessions, groups and
  // engine gone; the new one has fresh sessions for the same ranks).
  void RestartNode(int node) {
    auto fresh = std::make_unique<Node>(node, &fabric_);  // takes the node's place in the fabric
    for (int r = 0; r < 4; ++r) {
      if (NodeOf(r) != node) continue;
      fresh->sessions[r] = MakeSession(300 + r, r, 4);
      fresh->mem[r] = std::vector<float>(64, 0.0f);
    }
    nodes_[node] = std::move(fresh);
  }

  Group& G(int node, uint32_t id) { return *nodes_[node]->groups.at(id); }

  // Global rank `rank` submits an all-reduce of `count` floats.
  void SubmitAllReduce(uint32_t gid, int rank, uint64_t op_id, uint64_t seq, uint64_t count,
                       uint32_t epoch = 1) {
    Node& n = *nodes_[NodeOf(rank)];
    Group& g = *n.groups.at(gid);
    Arrival a;
    a.session = n.sessions[rank];
    a.desc.op_id = op_id;
    a.desc.seq = seq;
    a.desc.epoch = epoch;
    a.desc.collective = static_cast<uint8_t>(Collective::kAllReduce);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    a.desc.count = count;
    a.desc.premul_factor = a.desc.pre_divide = a.desc.post_divide = 1.0;
    a.desc.group_id = gid;
    a.epoch = epoch;
    a.seq = seq;
    a.send = n.mem[rank].data();
    a.recv = n.mem[rank].data() + 32;
    a.first_ns = shm::NowNanos();
    g.Arrive(g.RankOf(rank), std::move(a));
  }

  // A group whose members are all on node `n` (uses only that node's engine).
  static void MakeNodeLocalGroup(Node& n, uint32_t id, const std::vector<int>& ranks) {
    GroupSpec spec;
    spec.id = id;
    spec.key = GroupKey(JobKey{0, "job"}, ranks, 0);
    spec.job_id = "job";
    spec.ranks = ranks;
    spec.timeout_ns = kTimeoutNs;
    Node* np = &n;
    auto g = std::make_shared<Group>(std::move(spec), &n.engine,
                                     [np](uint32_t gid) -> std::shared_ptr<Group> {
                                       auto it = np->groups.find(gid);
                                       return it == np->groups.end() ? nullptr : it->second;
                                     });
    for (size_t i = 0; i < ranks.size(); ++i) {
      ASSERT_TRUE(g->Join(static_cast<int>(i), n.sessions[ranks[i]]).ok());
    }
    n.groups[id] = g;
  }

  // Rank `rank` of node `n` submits a 1-float-per-rank composite op.
  static void SubmitComposite(Node& n, uint32_t shard, uint32_t replicate, int rank,
                              uint64_t op_id) {
    Group& g = *n.groups.at(shard);
    Arrival a;
    a.session = n.sessions[rank];
    a.desc.op_id = op_id;
    a.desc.seq = a.desc.seq2 = 1;
    a.desc.epoch = a.desc.epoch2 = 1;
    a.desc.collective = static_cast<uint8_t>(Collective::kReduceScatterAllReduce);
    a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    a.desc.count = 1;
    a.desc.premul_factor = a.desc.pre_divide = a.desc.post_divide = 1.0;
    a.desc.group_id = shard;
    a.desc.group2_id = replicate;
    a.epoch = a.seq = 1;
    a.send = n.mem[rank].data();
    a.recv = n.mem[rank].data() + 32;
    a.first_ns = shm::NowNanos();
    g.Arrive(g.RankOf(rank), std::move(a));
  }

  std::optional<absl::Status> Result(int rank, uint64_t op_id) {
    const shm::Completion* c = CompletionOf(*nodes_[NodeOf(rank)]->sessions[rank], op_id);
    if (c == nullptr) return std::nullopt;
    return StatusOf(*c);
  }

  FakeFabric fabric_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(CrossNodeTest, OpSpanningLocalAndRemoteMembersRunsOnceEveryNodeLaunchedIt) {
  MakeGroup(1, {0, 1, 2, 3});
  EXPECT_TRUE(G(0, 1).IsLocal(0) && !G(0, 1).IsLocal(1) && G(0, 1).IsLocal(2));
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 8; ++i) nodes_[NodeOf(r)]->mem[r][i] = float(r * 10 + i);
  }
  // Node 0's local members are enough to launch its part.
  SubmitAllReduce(1, 0, 1, 1, 8);
  EXPECT_EQ(nodes_[0]->engine.pending(), 0u) << "rank 2 (also on node 0) has not arrived";
  SubmitAllReduce(1, 2, 1, 1, 8);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  const EngineTask t = nodes_[0]->engine.front();
  ASSERT_EQ(t.members.size(), 4u);
  EXPECT_TRUE(t.members[0].local);
  EXPECT_FALSE(t.members[1].local);
  EXPECT_EQ(t.members[1].node, 1);
  EXPECT_EQ(t.members[1].send.data, nullptr) << "a remote member's memory is not addressable";
  EXPECT_EQ(fabric_.RunReady(), 0) << "node 1 has not launched its part";
  SubmitAllReduce(1, 1, 1, 1, 8);
  SubmitAllReduce(1, 3, 1, 1, 8);
  EXPECT_EQ(fabric_.RunReady(), 1);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(Result(r, 1).has_value()) << "rank " << r;
    EXPECT_TRUE(Result(r, 1)->ok()) << *Result(r, 1);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(nodes_[NodeOf(r)]->mem[r][32 + i], float(60 + 4 * i)) << "rank " << r;
    }
  }
}

TEST_F(CrossNodeTest, RemoteNodeLostMidOpFailsEveryLocalMemberNamingItAndEndsTheEpoch) {
  MakeGroup(1, {0, 1, 2, 3});
  MakeGroup(2, {0, 2});  // node 0 only: unaffected by node 1's loss
  SubmitAllReduce(1, 0, 1, 1, 8);
  SubmitAllReduce(1, 2, 1, 1, 8);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);  // launched, waiting for node 1
  fabric_.KillNode(1, "heartbeats stopped");
  for (int r : {0, 2}) {
    ASSERT_TRUE(Result(r, 1).has_value()) << "rank " << r;
    EXPECT_FALSE(Result(r, 1)->ok());
    EXPECT_THAT(std::string(Result(r, 1)->message()), HasSubstr("node 1"));
  }
  EXPECT_EQ(nodes_[0]->engine.pending(), 0u);
  EXPECT_TRUE(G(0, 1).stats().broken);
  // The local members' error describes the operation; the report relayed
  // to the other daemons carries only the cause (they describe it
  // themselves: repeated, it would push the cause past the 208 bytes of a
  // completion message).
  EXPECT_THAT(std::string(Result(0, 1)->message()), HasSubstr("seq 1"));
  ASSERT_EQ(reported_[0].size(), 1u);
  EXPECT_THAT(reported_[0][0].second, HasSubstr("node 1"));
  EXPECT_THAT(reported_[0][0].second, ::testing::Not(HasSubstr("seq 1"))) << reported_[0][0].second;
  // Later work in the failed epoch names the lost ranks.
  SubmitAllReduce(1, 0, 2, 2, 8);
  ASSERT_TRUE(Result(0, 2).has_value());
  EXPECT_EQ(Result(0, 2)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(0, 2)->message()),
              AllOf(HasSubstr("node 1"), HasSubstr("[1, 3]"), HasSubstr("lost")));
  // A group without members there keeps working.
  SubmitAllReduce(2, 0, 3, 1, 4);
  SubmitAllReduce(2, 2, 3, 1, 4);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  ASSERT_TRUE(nodes_[0]->engine.Execute().ok());
  EXPECT_TRUE(Result(0, 3).value_or(absl::UnknownError("none")).ok());
}

TEST_F(CrossNodeTest, GroupReformsAcrossNodesInANewEpoch) {
  MakeGroup(1, {0, 1, 2, 3});
  SubmitAllReduce(1, 0, 1, 1, 8);
  fabric_.KillNode(1, "rebooted");
  ASSERT_TRUE(Result(0, 1).has_value());
  // Node 1 comes back (its daemon tells ours that its members joined epoch 2).
  ASSERT_EQ(*G(0, 1).Join(0, nodes_[0]->sessions[0]), 2u);
  ASSERT_EQ(*G(0, 1).Join(2, nodes_[0]->sessions[2]), 2u);
  EXPECT_EQ(G(0, 1).stats().epoch, 1u) << "remote members have not joined yet";
  G(0, 1).RemoteJoined(1, 2);
  EXPECT_EQ(G(0, 1).stats().epoch, 1u);
  G(0, 1).RemoteJoined(3, 2);
  EXPECT_EQ(G(0, 1).stats().epoch, 2u);
  EXPECT_FALSE(G(0, 1).stats().broken);
  // Sequence numbers restart at 1 in epoch 2.
  SubmitAllReduce(1, 0, 2, 1, 8, /*epoch=*/2);
  SubmitAllReduce(1, 2, 2, 1, 8, /*epoch=*/2);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  EXPECT_EQ(nodes_[0]->engine.front().epoch, 2u);
  EXPECT_EQ(nodes_[0]->engine.front().seq, 1u);
}

TEST_F(CrossNodeTest, RemoteMembersJoinTheNextEpochImplicitlyAndLocalFailuresAreReported) {
  MakeGroup(1, {0, 1, 2, 3});
  // Rank 0 (node 0) leaves: node 0 fails epoch 1 and reports it; node 1
  // hears (as the coordinator would relay it) and fails it too.
  G(0, 1).MemberLeft(nodes_[0]->sessions[0].get(), "killed");
  ASSERT_EQ(reported_[0].size(), 1u);
  EXPECT_EQ(reported_[0][0].first, 1u);
  EXPECT_THAT(reported_[0][0].second, HasSubstr("rank 0 left"));
  G(1, 1).RemoteEpochFailed(1, absl::AbortedError("node 0 reports: rank 0 left"));
  EXPECT_TRUE(G(1, 1).stats().broken);
  EXPECT_TRUE(reported_[1].empty()) << "a relayed failure is not reported again";
  // Each node's local members join again; remote ones need not be announced.
  ASSERT_EQ(*G(1, 1).Join(1, nodes_[1]->sessions[1]), 2u);
  ASSERT_EQ(*G(1, 1).Join(3, nodes_[1]->sessions[3]), 2u);
  EXPECT_EQ(G(1, 1).epoch(), 2u);
  ASSERT_EQ(*G(0, 1).Join(2, nodes_[0]->sessions[2]), 2u);
  EXPECT_EQ(G(0, 1).epoch(), 1u) << "rank 0 (local) has not joined yet";
  ASSERT_EQ(*G(0, 1).Join(0, nodes_[0]->sessions[0]), 2u);
  EXPECT_EQ(G(0, 1).epoch(), 2u);
  for (int r = 0; r < 4; ++r) SubmitAllReduce(1, r, 5, 1, 8, /*epoch=*/2);
  EXPECT_EQ(fabric_.RunReady(), 1);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(Result(r, 5).value_or(absl::UnknownError("none")).ok()) << "rank " << r;
  }
}

// A rank that detaches right after its last collective: its node fails the
// epoch, having completed that collective, while the other node may still
// be finishing its copy (CI saw a final barrier fail this way). The report
// names the last operation completed there; the others let theirs finish
// and fail only what comes after it.
TEST_F(CrossNodeTest, ARemoteFailureSparesTheOperationsItsOriginCompleted) {
  MakeGroup(1, {0, 1});
  SubmitAllReduce(1, 0, 1, 1, 4);
  SubmitAllReduce(1, 1, 1, 1, 4);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  ASSERT_EQ(nodes_[1]->engine.pending(), 1u);
  // Node 1 finishes its part of op 1 first; its rank then leaves: node 1
  // reports epoch 1 failed, having completed op 1.
  nodes_[1]->engine.Finish();
  ASSERT_TRUE(Result(1, 1).value_or(absl::UnknownError("none")).ok());
  G(1, 1).MemberLeft(nodes_[1]->sessions[1].get(), "detached");
  ASSERT_EQ(reported_seq_[1].size(), 1u);
  EXPECT_EQ(reported_seq_[1][0], 1u);
  // Node 0 hears it while its part of op 1 still runs: the epoch fails, op 1
  // is not aborted, and later operations fail.
  G(0, 1).RemoteEpochFailed(1, absl::AbortedError("node 1 reports: rank 1 left"),
                            reported_seq_[1][0]);
  EXPECT_TRUE(G(0, 1).stats().broken);
  EXPECT_TRUE(nodes_[0]->engine.aborted().empty());
  EXPECT_FALSE(Result(0, 1).has_value()) << "op 1 goes on";
  SubmitAllReduce(1, 0, 2, 2, 4);
  ASSERT_TRUE(Result(0, 2).has_value());
  EXPECT_EQ(Result(0, 2)->code(), absl::StatusCode::kAborted);
  nodes_[0]->engine.Finish();
  EXPECT_TRUE(Result(0, 1).value_or(absl::UnknownError("none")).ok());
}

TEST_F(CrossNodeTest, ARemoteFailureAbortsTheRunningOperationsItsOriginDidNotComplete) {
  MakeGroup(1, {0, 1});
  SubmitAllReduce(1, 0, 1, 1, 4);
  SubmitAllReduce(1, 1, 1, 1, 4);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  // Node 1's rank leaves with op 1 unfinished there: reported with 0.
  G(1, 1).MemberLeft(nodes_[1]->sessions[1].get(), "killed");
  ASSERT_EQ(reported_seq_[1].size(), 1u);
  EXPECT_EQ(reported_seq_[1][0], 0u);
  G(0, 1).RemoteEpochFailed(1, absl::AbortedError("node 1 reports: rank 1 left"),
                            reported_seq_[1][0]);
  EXPECT_EQ(nodes_[0]->engine.aborted().size(), 1u);
  ASSERT_TRUE(Result(0, 1).has_value());
  EXPECT_EQ(Result(0, 1)->code(), absl::StatusCode::kAborted) << *Result(0, 1);
}

// A drained and restarted daemon (node 1) whose restart the membership
// tells node 0 only after the new daemon created the group anew and ran
// operations with node 0 in the epoch both went to: node 0 went there on the
// old daemon's report that its member left, the new daemon started there
// because that failure was the last one reported. The late restart must not
// end that epoch: the new daemon's member never leaves it by itself, so it
// would be stuck in it while node 0 moved on.
TEST_F(CrossNodeTest, ARestartHeardAfterTheNewDaemonRanTheEpochLeavesItRunning) {
  MakeGroup(1, {0, 1});
  SubmitAllReduce(1, 0, 1, 1, 4);
  SubmitAllReduce(1, 1, 1, 1, 4);
  ASSERT_EQ(fabric_.RunReady(), 1);
  ASSERT_TRUE(Result(0, 1).value_or(absl::UnknownError("none")).ok());
  // Rank 0's next step waits for node 1, which drains: its member leaves,
  // node 1 reports epoch 1 failed, node 0 hears it through the coordinator.
  SubmitAllReduce(1, 0, 2, 2, 4);
  G(1, 1).MemberLeft(nodes_[1]->sessions[1].get(), "hsdpd is draining");
  ASSERT_EQ(reported_[1].size(), 1u);
  ASSERT_EQ(reported_[1][0].first, 1u);
  G(0, 1).RemoteEpochFailed(1, absl::AbortedError("node 1 reports: " + reported_[1][0].second));
  ASSERT_TRUE(Result(0, 2).has_value());
  EXPECT_EQ(Result(0, 2)->code(), absl::StatusCode::kAborted);
  // Rank 0 joins the next epoch; node 1's rank joins it implicitly.
  ASSERT_EQ(G(0, 1).Join(0, nodes_[0]->sessions[0]).value_or(0), 2u);
  ASSERT_EQ(G(0, 1).epoch(), 2u);
  SubmitAllReduce(1, 0, 3, 1, 4, /*epoch=*/2);
  // Node 1's new daemon: its trainer creates the group in the epoch after
  // the last failed one, and the step runs with node 0.
  RestartNode(1);
  MakeGroupOn(*nodes_[1], 1, {0, 1}, /*first_epoch=*/2);
  nodes_[1]->mem[1][0] = 5.0f;
  SubmitAllReduce(1, 1, 3, 1, 4, /*epoch=*/2);
  ASSERT_EQ(fabric_.RunReady(), 1);
  nodes_[0]->engine.Link(1, "new");  // the epoch's link reaches the new daemon
  ASSERT_TRUE(Result(0, 3).value_or(absl::UnknownError("none")).ok());
  ASSERT_TRUE(Result(1, 3).value_or(absl::UnknownError("none")).ok());
  // Only now does node 0's membership tell of the restart (lost and joined
  // in one view).
  G(0, 1).PeerLost(1, "node 1 (127.0.0.1:7070) restarted; cluster epoch 3", "old");
  G(0, 1).PeerJoined(1);
  EXPECT_EQ(G(0, 1).epoch(), 2u);
  EXPECT_FALSE(G(0, 1).stats().broken);
  EXPECT_TRUE(reported_[0].empty()) << "node 0 must not end the epoch the new daemon runs";
  // The loop goes on in epoch 2 on both daemons.
  nodes_[0]->mem[0][0] = 1.0f;
  nodes_[1]->mem[1][0] = 2.0f;
  SubmitAllReduce(1, 0, 4, 2, 4, /*epoch=*/2);
  SubmitAllReduce(1, 1, 4, 2, 4, /*epoch=*/2);
  ASSERT_EQ(fabric_.RunReady(), 1);
  for (int r : {0, 1}) {
    ASSERT_TRUE(Result(r, 4).has_value()) << "rank " << r;
    EXPECT_TRUE(Result(r, 4)->ok()) << "rank " << r << ": " << *Result(r, 4);
    EXPECT_EQ(nodes_[NodeOf(r)]->mem[r][32], 3.0f) << "rank " << r;
  }
}

// The restart heard while the epoch still runs over a link to the old daemon
// (an operation of it in flight that the closed connection has not failed
// yet): the epoch ends at once, naming the restart, and the node's ranks
// join the next epoch with the new daemon.
TEST_F(CrossNodeTest, ARestartHeardWhileTheEpochIsLinkedToTheOldDaemonEndsIt) {
  MakeGroup(1, {0, 1});
  nodes_[0]->engine.Link(1, "old");
  SubmitAllReduce(1, 0, 1, 1, 4);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  G(0, 1).PeerLost(1, "node 1 (127.0.0.1:7070) restarted; cluster epoch 3", "old");
  ASSERT_TRUE(Result(0, 1).has_value()) << "the operation on the old link must not wait on";
  EXPECT_EQ(Result(0, 1)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(0, 1)->message()),
              AllOf(HasSubstr("node 1"), HasSubstr("restarted"), HasSubstr("ended")));
  ASSERT_EQ(reported_[0].size(), 1u) << "the others learn that epoch 1 ended";
  EXPECT_EQ(reported_[0][0].first, 1u);
  ASSERT_EQ(G(0, 1).Join(0, nodes_[0]->sessions[0]).value_or(0), 2u);
  EXPECT_EQ(G(0, 1).epoch(), 1u) << "node 1's rank must join again first";
  G(0, 1).PeerJoined(1);
  EXPECT_EQ(G(0, 1).epoch(), 2u);
}

// The restart heard while the epoch has no link to node 1 yet (node 0 still
// waits in its rendezvous): the epoch is left running, for whichever daemon
// comes. If its link then fails on a lost connection (the old daemon had
// left an address behind), that operation fails with the transport's error
// and later submissions hear the restart, which ends the epoch.
TEST_F(CrossNodeTest, ARestartHeardBeforeAnyLinkNamesItIfTheLinkThenFails) {
  MakeGroup(1, {0, 1});
  SubmitAllReduce(1, 0, 1, 1, 4);
  ASSERT_EQ(nodes_[0]->engine.pending(), 1u);
  G(0, 1).PeerLost(1, "node 1 (127.0.0.1:7070) restarted; cluster epoch 3", "old");
  G(0, 1).PeerJoined(1);
  EXPECT_FALSE(G(0, 1).stats().broken);
  EXPECT_FALSE(Result(0, 1).has_value());
  EXPECT_TRUE(reported_[0].empty());
  nodes_[0]->engine.Finish(absl::UnavailableError(
      "all_reduce across nodes: connecting to nodes [0, 1]: connection to node 1 lost"));
  ASSERT_TRUE(Result(0, 1).has_value());
  EXPECT_EQ(Result(0, 1)->code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(reported_[0].size(), 1u);
  EXPECT_EQ(reported_[0][0].first, 1u);
  SubmitAllReduce(1, 0, 2, 2, 4);
  ASSERT_TRUE(Result(0, 2).has_value());
  EXPECT_EQ(Result(0, 2)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(0, 2)->message()),
              AllOf(HasSubstr("node 1"), HasSubstr("restarted"), HasSubstr("ended")));
}

// Rank 0 joined the next epoch while node 1 was still away, and queued its
// next step there; another daemon had already reported that epoch failed
// (it entered it before hearing of the loss). When node 1 is back the epoch
// starts failed, and the queued step fails at once instead of waiting for
// its deadline, saying that the epoch ended (within a completion's 208
// bytes, however long the loss's description).
TEST_F(CrossNodeTest, StepsQueuedForAnEpochAlreadyFailedElsewhereFailWhenItStarts) {
  MakeGroup(1, {0, 1});
  const std::string why =
      "node 1 (127.0.0.1:50757) was lost (its lease in etcd expired: no heartbeat for 1s, or it "
      "left); cluster epoch 3";
  G(0, 1).PeerLost(1, why);
  G(0, 1).RemoteEpochFailed(
      2, absl::AbortedError("node 2 reports: the epoch of group 4 (job \"job\") ended: node 1 "
                            "hosting rank(s) [1] was lost (" + why + ")"));
  ASSERT_EQ(G(0, 1).Join(0, nodes_[0]->sessions[0]).value_or(0), 2u);
  SubmitAllReduce(1, 0, 5, 1, 4, /*epoch=*/2);
  EXPECT_FALSE(Result(0, 5).has_value()) << "queued for epoch 2";
  G(0, 1).PeerJoined(1);
  EXPECT_EQ(G(0, 1).epoch(), 2u);
  ASSERT_TRUE(Result(0, 5).has_value()) << "must not wait for its deadline";
  EXPECT_EQ(Result(0, 5)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(0, 5)->message()),
              AllOf(HasSubstr("node 2 reports"), HasSubstr("ended")));
  // The loss seen here names the ranks, and says the epoch ended even cut.
  SubmitAllReduce(1, 0, 6, 2, 4, /*epoch=*/2);
  ASSERT_TRUE(Result(0, 6).has_value());
  EXPECT_THAT(std::string(Result(0, 6)->message()), HasSubstr("ended"));
}

TEST_F(CrossNodeTest, CompositePipelinesAcrossTwoStreamOrderedPhases) {
  // One node, a 2x2 mesh: shard groups {0,2}/{1,3} are node 0 only here, so
  // use a single-node layout with the engine of node 0 for everything.
  Node& n = *nodes_[0];
  n.sessions[1] = MakeSession(201, 1, 4);
  n.sessions[3] = MakeSession(203, 3, 4);
  n.mem[1] = std::vector<float>(64, 0.0f);
  n.mem[3] = std::vector<float>(64, 0.0f);
  auto make = [&](uint32_t id, std::vector<int> ranks) { MakeNodeLocalGroup(n, id, ranks); };
  make(11, {0, 1});  // shard groups
  make(12, {2, 3});
  make(21, {0, 2});  // replicate groups
  make(22, {1, 3});
  // Every rank contributes 1, 2 (two shards of 2 floats: count 2 per rank... here 1 float).
  for (int r = 0; r < 4; ++r) {
    n.mem[r][0] = float(r + 1);
    n.mem[r][1] = float(10 * (r + 1));
  }
  auto submit = [&](uint32_t shard, uint32_t replicate, int rank) {
    SubmitComposite(n, shard, replicate, rank, 1);
  };
  submit(11, 21, 0);
  submit(11, 22, 1);
  submit(12, 21, 2);
  submit(12, 22, 3);
  // Both reduce-scatters and both all-reduces are in the engine at once: the
  // second phase did not wait for the first to finish (no CPU round trip).
  ASSERT_EQ(n.engine.pending(), 4u);
  const uint64_t rs1 = n.engine.front_ticket();
  // The fake enforces the dependency an engine must honour.
  const EngineTask first = n.engine.front();
  EXPECT_EQ(first.collective, Collective::kReduceScatter);
  EXPECT_EQ(n.engine.Complete(rs1 + 2, absl::OkStatus()).code(),
            absl::StatusCode::kFailedPrecondition)
      << "an all-reduce must not finish before the reduce-scatters it depends on";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(n.engine.Execute().ok()) << i;
  // Rank r's shard r%2 summed over its shard group, then over the replicate group.
  // Shard 0 (first float): sum over all ranks of (r+1) = 10; shard 1: 100.
  for (int r = 0; r < 4; ++r) {
    const shm::Completion* c = CompletionOf(*n.sessions[r], 1);
    ASSERT_NE(c, nullptr) << "rank " << r;
    EXPECT_TRUE(StatusOf(*c).ok()) << StatusOf(*c);
  }
  EXPECT_EQ(n.mem[0][32], 10.0f);
  EXPECT_EQ(n.mem[2][32], 10.0f);
  EXPECT_EQ(n.mem[1][32], 100.0f);
  EXPECT_EQ(n.mem[3][32], 100.0f);
}

TEST_F(CrossNodeTest, CompositeSecondPhaseFailsWhenTheFirstFailsInTheEngine) {
  Node& n = *nodes_[0];
  n.sessions[1] = MakeSession(201, 1, 4);
  n.mem[1] = std::vector<float>(64, 0.0f);
  auto make = [&](uint32_t id, std::vector<int> ranks) { MakeNodeLocalGroup(n, id, ranks); };
  make(11, {0, 1});  // shard group
  make(21, {0});     // replicate groups of one
  make(22, {1});
  for (int rank : {0, 1}) SubmitComposite(n, 11, rank == 0 ? 21 : 22, rank, 5);
  ASSERT_EQ(n.engine.pending(), 3u);
  n.engine.Finish(absl::InternalError("transport error in the reduce-scatter"));
  ASSERT_EQ(n.engine.pending(), 2u);
  n.engine.Finish();  // the dependent all-reduces: the fake fails them with the dependency
  n.engine.Finish();
  for (int r : {0, 1}) {
    const shm::Completion* c = CompletionOf(*n.sessions[r], 5);
    ASSERT_NE(c, nullptr) << "rank " << r;
    EXPECT_EQ(StatusOf(*c).code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(StatusOf(*c).message()), HasSubstr("transport error"));
  }
}

TEST_F(CrossNodeTest, EpochFailureAbortsRunningOpsInTheEngine) {
  MakeGroup(1, {0, 1, 2, 3});
  SubmitAllReduce(1, 0, 1, 1, 8);
  SubmitAllReduce(1, 2, 1, 1, 8);
  const uint64_t ticket = nodes_[0]->engine.front_ticket();
  G(0, 1).MemberLeft(nodes_[0]->sessions[2].get(), "killed");
  EXPECT_EQ(nodes_[0]->engine.aborted(), std::vector<uint64_t>{ticket});
  ASSERT_TRUE(Result(0, 1).has_value());
  EXPECT_EQ(Result(0, 1)->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(Result(0, 1)->message()), HasSubstr("rank 2 left"));
}

}  // namespace
}  // namespace hsdp
