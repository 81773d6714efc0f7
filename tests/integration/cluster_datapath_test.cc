// Collectives across real hsdpd processes that form a cluster on loopback:
// every trainer (a forked process) attaches to its own node's daemon with
// (job, global rank, world size) and creates groups by global ranks; the
// daemons find where every rank lives through the coordinator and run the
// group across nodes. Rank layouts are not contiguous per node. Results are
// checked against an independent reference (collective_check.h). Failures:
// a trainer killed on one node fails the group's operations on the other
// node naming the rank; a daemon killed fails them naming the node, while a
// group local to a surviving node keeps working and the survivors form a new
// group that runs. Every wait is bounded.
#include <signal.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cluster_fixture.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"

namespace hsdp::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ClusterDatapathTest : public ClusterFixture {};

// 2 nodes x 2 trainers, ranks {0, 3} on node 0 and {1, 2} on node 1.
TEST_F(ClusterDatapathTest, TwoNodesTwoTrainersEveryCollectiveMatchesTheReference) {
  StartCluster(2);
  const std::vector<int> placement = {0, 1, 1, 0};
  RunRanks(placement, [](Trainer* T, int rank) {
    Group all, cross;
    if (!MakeGroup(T, {0, 1, 2, 3}, &all)) return Report(T);
    EveryCollectiveCase(T, all);
    Sync(T, "collectives");
    // A group whose ranks are listed out of order, one on each node.
    if (rank == 3 || rank == 1) {
      if (!MakeGroup(T, {3, 1}, &cross)) return Report(T);
      AllReduceCase(T, cross, DataType::kFloat32, {}, 10000);
      AllGatherCase(T, cross, DataType::kFloat32, 100);
    }
    Sync(T, "subgroup");
    // Point-to-point across nodes (0 -> 1 and 2 -> 3), twice per pair so
    // the k-th send pairs with the k-th receive; and within node 1.
    SendRecvCase(T, all, 0, 1, 7, 3000);
    Sync(T, "p2p1");
    SendRecvCase(T, all, 2, 3, 7, 10);
    Sync(T, "p2p2");
    SendRecvCase(T, all, 0, 1, 7, 20);
    SendRecvCase(T, all, 1, 2, 0, 50);
    return Report(T);
  });
}

// HSDP 2x2 in both placements: shard groups inside a node and the
// replicate group across nodes, and the transpose.
TEST_F(ClusterDatapathTest, TwoNodesHsdpMeshBothPlacementsCompositeMatchesTheReference) {
  StartCluster(2);
  const std::vector<int> placement = {0, 1, 1, 0};  // node 0: {0, 3}; node 1: {1, 2}
  RunRanks(placement, [](Trainer* T, int rank) {
    const std::vector<int> mesh = {0, 1, 2, 3};
    // Placement A: shard = node ({0, 3} / {1, 2}), replicate across ({0, 1} / {3, 2}).
    const bool node0 = rank == 0 || rank == 3;
    Group shard, replicate;
    if (!MakeGroup(T, node0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2}, &shard)) {
      return Report(T);
    }
    const bool first = rank == 0 || rank == 1;
    if (!MakeGroup(T, first ? std::vector<int>{0, 1} : std::vector<int>{3, 2}, &replicate)) {
      return Report(T);
    }
    for (int bucket = 0; bucket < 3; ++bucket) {  // consecutive buckets pipeline
      CompositeCase(T, shard, replicate, mesh, DataType::kFloat32, {}, 1000 + bucket, "A");
    }
    CompositeCase(T, shard, replicate, mesh, DataType::kFloat32,
                  ReduceOptions{ReduceOp::kAvg, 1.0, 2.0, 1.0, DataType::kBFloat16}, 512, "A");
    // Placement B (transpose): shard across nodes, replicate inside a node.
    Group shard2, replicate2;
    if (!MakeGroup(T, first ? std::vector<int>{0, 1} : std::vector<int>{3, 2}, &shard2)) {
      return Report(T);
    }
    if (!MakeGroup(T, node0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2}, &replicate2)) {
      return Report(T);
    }
    CompositeCase(T, shard2, replicate2, mesh, DataType::kFloat32, {}, 2048, "B");
    // Accumulation variant: reduce-scatter only, all-reduce once at the end.
    ReduceScatterCase(T, shard2, DataType::kFloat32, {}, 300);
    return Report(T);
  });
}

// 3 nodes x 1 trainer, ranks placed 0 -> node 2, 1 -> node 0, 2 -> node 1.
TEST_F(ClusterDatapathTest, ThreeNodesOneTrainerEach) {
  StartCluster(3);
  RunRanks({2, 0, 1}, [](Trainer* T, int rank) {
    Group all;
    if (!MakeGroup(T, {0, 1, 2}, &all)) return Report(T);
    AllReduceCase(T, all, DataType::kFloat32, {}, 50000);
    ReduceScatterCase(T, all, DataType::kFloat32, {}, 1000);
    AllGatherCase(T, all, DataType::kFloat32, 1000);
    BroadcastCase(T, all, DataType::kFloat32, 1, 100);
    AllToAllCase(T, all, DataType::kInt32, 100);
    // A subset over two of the three nodes (node 0 hosts no member).
    if (rank != 1) {
      Group two;
      if (!MakeGroup(T, {2, 0}, &two)) return Report(T);
      AllReduceCase(T, two, DataType::kFloat32, {}, 999);
    }
    return Report(T);
  });
}

// 3 nodes x 2 trainers; every rank's node differs from its neighbours'.
TEST_F(ClusterDatapathTest, ThreeNodesTwoTrainersEach) {
  StartCluster(3);
  RunRanks({0, 1, 2, 0, 1, 2}, [](Trainer* T, int) {
    Group all;
    if (!MakeGroup(T, {0, 1, 2, 3, 4, 5}, &all)) return Report(T);
    AllReduceCase(T, all, DataType::kFloat32, {}, 30000);
    AllReduceCase(T, all, DataType::kFloat16, ReduceOptions{ReduceOp::kSum}, 1000);
    ReduceScatterCase(T, all, DataType::kFloat32, {}, 500);
    AllGatherCase(T, all, DataType::kFloat32, 500);
    return Report(T);
  });
}

// A trainer killed on node 1 fails the group's operation on node 0 naming
// its rank, well before the collective timeout.
TEST_F(ClusterDatapathTest, TrainerKilledFailsOpsOnTheOtherNodeNamingTheRank) {
  StartCluster(2, /*collective_ms=*/20000);
  const std::string formed = shared_.File("formed");
  const std::string victim_ready = shared_.File("victim-ready");
  const std::string job = job_;
  const std::string s0 = Socket(0), s1 = Socket(1);
  Child victim([=](FILE* out) {
    Trainer T;
    T.out = out;
    if (!Attach(&T, s1, job, 1, 2)) return 2;
    Group g;
    if (!MakeGroup(&T, {0, 1}, &g)) return 2;
    AllReduceCase(&T, g, DataType::kFloat32, {}, 100);  // the group works first
    WriteFile(victim_ready, "");
    ::pause();  // killed here
    return 0;
  });
  Child survivor([=](FILE* out) {
    Trainer T;
    T.out = out;
    if (!Attach(&T, s0, job, 0, 2)) return 2;
    Group g;
    if (!MakeGroup(&T, {0, 1}, &g)) return 2;
    AllReduceCase(&T, g, DataType::kFloat32, {}, 100);
    if (T.failures > 0) return 2;
    WriteFile(formed, "");
    // This one waits for rank 1, which dies meanwhile.
    Fill(&T, DataType::kFloat32, 100);
    absl::StatusOr<Work> w = T.client->AllReduce(g, {T.send.id, 0}, {T.recv.id, 0}, 100,
                                                 DataType::kFloat32);
    if (!w.ok()) return 3;
    const int64_t start = NowMs();
    const absl::Status s = w->Wait(absl::Seconds(19));
    std::fprintf(out, "RESULT %s after %lld ms\n", s.ToString().c_str(),
                 static_cast<long long>(NowMs() - start));
    return 0;
  });
  ASSERT_TRUE(WaitFile(victim_ready, kChildMs)) << victim.output() << Logs();
  ASSERT_TRUE(WaitFile(formed, kChildMs)) << survivor.output() << Logs();
  // The survivor's operation has reached its daemon before rank 1 dies.
  ASSERT_TRUE(Eventually([&] { return OpsInDaemon(s0, job) >= 1; }, kChildMs))
      << survivor.output() << Logs();
  ::kill(victim.pid(), SIGKILL);
  ASSERT_EQ(survivor.Finish(kChildMs), 0) << survivor.output() << Logs();
  const std::string out = survivor.output();
  std::printf("survivor: %s", out.c_str());  // how long the failure took to arrive
  EXPECT_THAT(out, AllOf(HasSubstr("RESULT ABORTED"), HasSubstr("rank 1"), HasSubstr("left")))
      << out << Logs();
  EXPECT_THAT(out, ::testing::Not(HasSubstr("DEADLINE_EXCEEDED"))) << out;
}

// Node 2's daemon is killed: the 4-rank group's operation on node 0 fails
// naming node 2; a group local to node 0 keeps working; the survivors
// (ranks 0, 1, 3) form a new group and run.
TEST_F(ClusterDatapathTest, DaemonKilledFailsOpsNamingTheNodeAndSurvivorsGoOn) {
  StartCluster(3, /*collective_ms=*/20000);
  const std::string formed = shared_.File("formed");
  const std::string lost = shared_.File("lost");
  const std::string job = job_;
  // node 0: ranks 0, 3; node 1: rank 1; node 2: rank 2.
  const std::vector<int> placement = {0, 1, 2, 0};
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 4; ++r) {
    const std::string socket = Socket(placement[r]);
    children.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      if (!Attach(&T, socket, job, r, 4)) return 2;
      Group all, local;
      if (!MakeGroup(&T, {0, 1, 2, 3}, &all)) return 2;
      AllReduceCase(&T, all, DataType::kFloat32, {}, 200);
      if (T.failures > 0) return 2;
      if (r == 0 || r == 3) {
        if (!MakeGroup(&T, {3, 0}, &local)) return 2;
      }
      WriteFile(formed + std::to_string(r), "");
      if (r == 2) {
        ::pause();  // its daemon is killed
        return 0;
      }
      // Every survivor submits; the operation cannot finish without rank 2.
      Fill(&T, DataType::kFloat32, 200);
      absl::StatusOr<Work> w = T.client->AllReduce(all, {T.send.id, 0}, {T.recv.id, 0}, 200,
                                                   DataType::kFloat32);
      if (!w.ok()) return 3;
      const absl::Status s = w->Wait(absl::Seconds(19));
      std::fprintf(out, "RESULT %s\n", s.ToString().c_str());
      if (!WaitFile(lost, kChildMs)) return 4;
      // Later work in the failed epoch names the lost node and its rank.
      absl::StatusOr<Work> again = T.client->AllReduce(all, {T.send.id, 0}, {T.recv.id, 0}, 200,
                                                       DataType::kFloat32);
      if (!again.ok()) return 3;
      std::fprintf(out, "AGAIN %s\n", again->Wait(absl::Seconds(19)).ToString().c_str());
      if (r == 0 || r == 3) AllReduceCase(&T, local, DataType::kFloat32, {}, 5000);
      Group survivors;
      if (!MakeGroup(&T, {0, 1, 3}, &survivors)) return Report(&T);
      AllReduceCase(&T, survivors, DataType::kFloat32, {}, 4000);
      AllGatherCase(&T, survivors, DataType::kFloat32, 100);
      return Report(&T);
    }));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(WaitFile(formed + std::to_string(r), kChildMs))
        << "rank " << r << ": " << children[r]->output() << Logs();
  }
  // The survivors' operation has reached nodes 0 and 1 before node 2 dies.
  for (int node : {0, 1}) {
    ASSERT_TRUE(Eventually([&] { return OpsInDaemon(Socket(node), job) >= 1; }, kChildMs))
        << "node " << node << Logs();
  }
  daemons_[2]->process.Kill();
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(children[r]->WaitFor("RESULT", kChildMs))
        << "rank " << r << ": " << children[r]->output() << Logs();
  }
  // Both surviving daemons have declared node 2 lost.
  for (int node : {0, 1}) {
    v1::NodesResponse view;
    ASSERT_TRUE(Eventually(
        [&] { return QueryNodes(Socket(node), &view) && StateOf(view, 2) == "lost"; }, kFormMs))
        << view.DebugString();
  }
  WriteFile(lost, "");
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(children[r]->Finish(kChildMs), 0)
        << "rank " << r << ":\n" << children[r]->output() << Logs();
    // On node 0 and on node 1 alike, the failure names the lost node: at
    // once through the broken connection (UNAVAILABLE) or through the
    // coordinator (ABORTED), and afterwards with its ranks.
    const std::string out = children[r]->output();
    EXPECT_THAT(out, HasSubstr("node 2")) << "rank " << r;
    EXPECT_THAT(out, ::testing::ContainsRegex("RESULT (UNAVAILABLE|ABORTED)")) << out;
    EXPECT_THAT(out, AllOf(HasSubstr("AGAIN ABORTED"), HasSubstr("rank(s) [2]"))) << out;
  }
}


// The only trainer of node 1 dies and is restarted: its daemon forgot the
// group, creates it again in the epoch after the one that failed (learnt
// from the coordinator), node 0's survivor joins that epoch, and they run.
TEST_F(ClusterDatapathTest, ARestartedTrainerRejoinsTheGroupInTheNextEpoch) {
  StartCluster(2, /*collective_ms=*/20000);
  const std::string ready = shared_.File("ready");
  const std::string again = shared_.File("again");
  const std::string job = job_;
  const std::string s0 = Socket(0), s1 = Socket(1);
  auto trainer1 = [=](const std::string& mark) {
    return [=](FILE* out) {
      Trainer T;
      T.out = out;
      T.world = 2;
      if (!Attach(&T, s1, job, 1, 2)) return 2;
      Group g;
      if (!MakeGroup(&T, {0, 1}, &g)) return 2;
      std::fprintf(out, "EPOCH %u\n", g.epoch);
      AllReduceCase(&T, g, DataType::kFloat32, {}, 1000);
      WriteFile(mark, "");
      if (mark == ready) ::pause();  // killed here
      return Report(&T);
    };
  };
  auto first = std::make_unique<Child>(trainer1(ready));
  Child survivor([=](FILE* out) {
    Trainer T;
    T.out = out;
    if (!Attach(&T, s0, job, 0, 2)) return 2;
    Group g;
    if (!MakeGroup(&T, {0, 1}, &g)) return 2;
    AllReduceCase(&T, g, DataType::kFloat32, {}, 1000);
    if (!WaitFile(ready, kChildMs)) return 4;
    // Rank 1 dies while this operation waits for it.
    Fill(&T, DataType::kFloat32, 10);
    absl::StatusOr<Work> w =
        T.client->AllReduce(g, {T.send.id, 0}, {T.recv.id, 0}, 10, DataType::kFloat32);
    if (!w.ok()) return 3;
    std::fprintf(out, "RESULT %s\n", w->Wait(absl::Seconds(19)).ToString().c_str());
    absl::StatusOr<Group> next = T.client->RejoinGroup(g);
    if (!next.ok()) {
      T.Fail("rejoin: " + next.status().ToString());
      return Report(&T);
    }
    std::fprintf(out, "EPOCH %u\n", next->epoch);
    AllReduceCase(&T, *next, DataType::kFloat32, {}, 1000);
    if (!WaitFile(again, kChildMs)) return 5;
    return Report(&T);
  });
  ASSERT_TRUE(WaitFile(ready, kChildMs)) << first->output() << survivor.output() << Logs();
  // The survivor's operation waits for rank 1 in node 0's daemon.
  ASSERT_TRUE(Eventually([&] { return OpsInDaemon(s0, job) >= 1; }, kChildMs))
      << survivor.output() << Logs();
  ::kill(first->pid(), SIGKILL);
  ASSERT_TRUE(survivor.WaitFor("EPOCH 2", kChildMs)) << survivor.output() << Logs();
  Child second(trainer1(again));
  EXPECT_EQ(second.Finish(kChildMs), 0) << second.output() << Logs();
  EXPECT_EQ(survivor.Finish(kChildMs), 0) << survivor.output() << Logs();
  EXPECT_THAT(survivor.output(), AllOf(HasSubstr("RESULT ABORTED"), HasSubstr("rank 1 left")));
  EXPECT_THAT(second.output(), HasSubstr("EPOCH 2"));
}

// Node 1's daemon is killed and started again under its trainer:
// the cluster sees node 1 lost and back; node 1's trainer reconnects by
// itself (ClientOptions::reconnect) and creates the group again, node 0's
// trainer, which never restarts, joins the group's next epoch; they run.
TEST_F(ClusterDatapathTest, ADaemonRestartedUnderItsTrainerAndTheOtherNodesRankGoOn) {
  StartCluster(2, /*collective_ms=*/20000);
  const std::string ready = shared_.File("ready");
  const std::string restarted = shared_.File("restarted");
  const std::string job = job_;
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 2; ++r) {
    const std::string socket = Socket(r);
    children.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      T.world = 2;
      if (!Attach(&T, socket, job, r, 2)) return 2;
      Group g;
      if (!MakeGroup(&T, {0, 1}, &g)) return 2;
      AllReduceCase(&T, g, DataType::kFloat32, {}, 1000);
      WriteFile(ready + std::to_string(r), "");
      if (!WaitFile(restarted, kChildMs)) return 4;
      // Until one all-reduce works: node 1's trainer retries (its client
      // reconnects on the way), node 0's joins the group's next epoch after
      // each failure that says the epoch ended.
      absl::Status s = absl::UnknownError("not run");
      const absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (absl::Now() < give_up) {
        Fill(&T, DataType::kFloat32, 100);
        absl::StatusOr<Work> w =
            T.client->AllReduce(g, {T.send.id, 0}, {T.recv.id, 0}, 100, DataType::kFloat32);
        s = w.ok() ? w->Wait(absl::Seconds(25)) : w.status();
        std::fprintf(out, "TRY %s\n", s.ToString().c_str());
        if (s.ok()) break;
        if (r == 0 && !absl::IsUnavailable(s)) {
          absl::StatusOr<Group> next = T.client->RejoinGroup(g);
          std::fprintf(out, "REJOIN %s\n",
                       next.ok() ? ("epoch " + std::to_string(next->epoch)).c_str()
                                 : next.status().ToString().c_str());
          if (next.ok()) g = *next;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
      if (!s.ok()) {
        T.Fail("never ran again: " + s.ToString());
        return Report(&T);
      }
      AllReduceCase(&T, g, DataType::kFloat32, {}, 1000);
      AllGatherCase(&T, g, DataType::kFloat32, 100);
      std::fprintf(out, "RECONNECTS %llu\n",
                   static_cast<unsigned long long>(T.client->reconnects()));
      WriteFile(shared_.File("done") + std::to_string(r), "");
      if (!WaitFile(shared_.File("done") + std::to_string(1 - r), kChildMs)) return 5;
      return Report(&T);
    }));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFile(ready + std::to_string(r), kChildMs))
        << children[r]->output() << Logs();
  }
  const std::string yaml = ReadFile(daemons_[1]->dir.File("node.yaml"));
  daemons_[1]->process.Kill();
  ASSERT_TRUE(daemons_[1]->process.Start(yaml, {}, {}, /*wait_ready=*/true)) << Logs();
  WriteFile(restarted, "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(children[r]->Finish(kChildMs), 0) << "rank " << r << ":\n"
                                                << children[r]->output() << Logs();
  }
  EXPECT_THAT(children[1]->output(), HasSubstr("RECONNECTS 1"));
  EXPECT_THAT(children[0]->output(), HasSubstr("RECONNECTS 0"));
  EXPECT_THAT(children[0]->output(), HasSubstr("REJOIN epoch"));
}

// A training loop with rank r on node r (two nodes, or three) across a
// restart of node 1's daemon, by `hsdpctl drain` or by SIGKILL: step s
// all-reduces 4 floats of rank + 1 + s. A failed step is not counted; the
// ranks then agree (all-reduce min of the steps each completed) where to go
// on, the other nodes' trainers joining the group's next epoch whenever a
// failure says the epoch ended, node 1's reconnecting by itself. The sums
// equal an uninterrupted run's; nobody restarted. (The restart may reach
// the other daemons' membership only after the new daemon created the
// group again and ran steps with them; that epoch must go on.)
class ClusterRestartLoopTest
    : public ClusterFixture,
      public ::testing::WithParamInterface<std::tuple<bool /*drain*/, int /*nodes*/>> {};

TEST_P(ClusterRestartLoopTest, TheLoopGoesOnAcrossARestartOfOneNodesDaemon) {
  const bool drain = std::get<0>(GetParam());
  const int nodes = std::get<1>(GetParam());
  StartCluster(nodes, /*collective_ms=*/20000);
  constexpr int kSteps = 300;
  const std::string progress = shared_.File("progress");
  const std::string job = job_ + (drain ? "-drain" : "-kill");
  std::vector<int> ranks;
  for (int r = 0; r < nodes; ++r) ranks.push_back(r);
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < nodes; ++r) {
    const std::string socket = Socket(r);
    children.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      T.world = nodes;
      if (!Attach(&T, socket, job, r, nodes)) return 2;
      Group g;
      if (!MakeGroup(&T, ranks, &g)) return 2;
      auto* v = static_cast<float*>(T.send.data);
      auto* a = static_cast<float*>(T.recv.data);
      auto run = [&](BufferRef buf, uint64_t n, ReduceOp op) {
        absl::StatusOr<Work> w = T.client->AllReduce(g, buf, buf, n, DataType::kFloat32,
                                                     ReduceOptions{op});
        const absl::Status s = w.ok() ? w->Wait(absl::Seconds(25)) : w.status();
        if (!s.ok() && r != 1 && !absl::IsUnavailable(s) &&
            absl::StrContains(s.message(), "ended")) {
          absl::StatusOr<Group> next = T.client->RejoinGroup(g);
          if (next.ok()) g = *next;
        }
        return s;
      };
      std::vector<double> history = {0.0};
      int step = 0, failures = 0;
      const absl::Time give_up = absl::Now() + absl::Seconds(90);
      while (step < kSteps && absl::Now() < give_up) {
        for (int i = 0; i < 4; ++i) v[i] = float(r + 1 + step);
        absl::Status s = run({T.send.id, 0}, 4, ReduceOp::kSum);
        if (s.ok()) {
          history.push_back(history.back() + v[0]);
          if (++step == 100) WriteFile(progress + std::to_string(r), "");
          absl::SleepFor(absl::Milliseconds(1));
          continue;
        }
        ++failures;
        std::fprintf(out, "STEP %d %s\n", step, s.ToString().c_str());
        for (;;) {  // agree where to go on
          a[0] = float(step);
          s = run({T.recv.id, 0}, 1, ReduceOp::kMin);
          if (s.ok() || absl::Now() > give_up) break;
          absl::SleepFor(absl::Milliseconds(20));
        }
        if (!s.ok()) break;
        step = static_cast<int>(a[0]);
        history.resize(step + 1);
      }
      double want = 0;
      for (int s = 0; s < kSteps; ++s) {
        for (int q = 0; q < nodes; ++q) want += q + 1 + s;
      }
      std::fprintf(out, "TOTAL %.1f WANT %.1f FAILURES %d RECONNECTS %llu\n", history.back(),
                   want, failures, static_cast<unsigned long long>(T.client->reconnects()));
      if (step != kSteps || history.back() != want) T.Fail("the loop did not finish right");
      WriteFile(shared_.File("done") + std::to_string(r), "");
      for (int q = 0; q < nodes; ++q) {
        if (!WaitFile(shared_.File("done") + std::to_string(q), kChildMs)) return 5;
      }
      return Report(&T);
    }));
  }
  for (int r = 0; r < nodes; ++r) {
    ASSERT_TRUE(WaitFile(progress + std::to_string(r), kChildMs))
        << children[r]->output() << Logs();
  }
  const std::string yaml = ReadFile(daemons_[1]->dir.File("node.yaml"));
  if (drain) {
    const auto d = RunCommand(Hsdpctl(Socket(1), "drain --timeout 10"));
    EXPECT_EQ(d.exit_code, 0) << d.output;
    EXPECT_EQ(daemons_[1]->process.WaitForExit(10000), 0) << Logs();
  } else {
    daemons_[1]->process.Kill();
  }
  ASSERT_TRUE(daemons_[1]->process.Start(yaml, {}, {}, /*wait_ready=*/true)) << Logs();
  for (int r = 0; r < nodes; ++r) {
    EXPECT_EQ(children[r]->Finish(120000), 0) << "rank " << r << ":\n"
                                              << children[r]->output() << Logs();
  }
  for (int r = 0; r < nodes; ++r) {
    EXPECT_THAT(children[r]->output(), HasSubstr(r == 1 ? "RECONNECTS 1" : "RECONNECTS 0"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    DrainOrKill, ClusterRestartLoopTest,
    ::testing::Combine(::testing::Bool(), ::testing::Values(2, 3)), [](const auto& info) {
      const std::string what = std::get<0>(info.param) ? "Drain" : "Sigkill";
      const int nodes = std::get<1>(info.param);
      return nodes == 2 ? what : what + std::to_string(nodes) + "Nodes";
    });

// A daemon still waiting for its coordinator stops at once on SIGTERM
// (it used to ignore it until cluster.join_timeout_ms).
TEST_F(ClusterDatapathTest, ADaemonStillJoiningStopsPromptlyOnSigterm) {
  ClusterDaemon d;
  const std::string nobody = Loopback(FreePort());  // no coordinator (or etcd) there
  std::string yaml = ClusterYaml(nobody, Loopback(FreePort()), 2, token_,
                                 /*join_timeout_ms=*/60000);
  if (OnEtcd()) {
    yaml = absl::StrCat("cluster:\n  store: etcd\n  etcd:\n    endpoints: [\"", nobody,
                        "\"]\n  insecure: true\n  listen: \"", Loopback(FreePort()),
                        "\"\n  nodes: 2\n  join_timeout_ms: 60000\n");
  }
  ASSERT_TRUE(d.process.Start(yaml, {}, {}, /*wait_ready=*/false));
  const std::string waiting = OnEtcd() ? "waiting for etcd" : "waiting for the coordinator";
  ASSERT_TRUE(Eventually([&] { return d.log().find(waiting) != std::string::npos; }, kFormMs))
      << d.log();
  const int64_t start = NowMs();
  EXPECT_EQ(d.process.Stop(/*timeout_ms=*/5000), 0) << d.log();
  EXPECT_LT(NowMs() - start, 5000);
  EXPECT_THAT(d.log(), HasSubstr("while starting"));
}

// With the coordinator gone, what needs it fails loudly naming it (a new
// trainer's placement, a new cross-node group), while a group that already
// spans nodes 1 and 2 keeps running (its links are up).
TEST_F(ClusterDatapathTest, WithoutTheCoordinatorNewPlacementFailsNamingIt) {
  StartCluster(3);
  const std::string formed = shared_.File("formed");
  const std::string gone = shared_.File("gone");
  const std::string job = job_;
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 2; ++r) {
    const std::string socket = Socket(r + 1);  // rank 0 on node 1, rank 1 on node 2
    children.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      if (!Attach(&T, socket, job, r, 2)) return 2;
      Group g;
      if (!MakeGroup(&T, {0, 1}, &g)) return 2;
      AllReduceCase(&T, g, DataType::kFloat32, {}, 100);
      WriteFile(formed + std::to_string(r), "");
      if (!WaitFile(gone, kChildMs)) return 4;
      AllReduceCase(&T, g, DataType::kFloat32, {}, 100);  // established: still runs
      if (r == 1) {
        absl::StatusOr<Group> more = T.client->NewGroup({1, 0});
        std::fprintf(out, "NEWGROUP %s\n", more.status().ToString().c_str());
      }
      WriteFile(formed + "done" + std::to_string(r), "");
      if (!WaitFile(formed + "done" + std::to_string(1 - r), kChildMs)) return 5;
      return Report(&T);
    }));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFile(formed + std::to_string(r), kChildMs)) << children[r]->output() << Logs();
  }
#ifdef HSDP_ETCD_BIN
  if (OnEtcd()) {
    // etcd: no coordinator; the store is gone when etcd loses its quorum.
    SharedEtcd().Kill(1);
    SharedEtcd().Kill(2);
  } else
#endif
    daemons_[0]->process.Kill();  // the coordinator
  WriteFile(gone, "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(children[r]->Finish(kChildMs), 0) << children[r]->output() << Logs();
  }
  // The embedded store is unreachable (UNAVAILABLE); etcd without a leader
  // answers UNAVAILABLE or lets the call run out (DEADLINE_EXCEEDED).
  const std::string failed = OnEtcd() ? "" : "UNAVAILABLE";
  EXPECT_THAT(children[1]->output(),
              AllOf(HasSubstr("NEWGROUP " + failed), Not(HasSubstr("NEWGROUP OK")),
                    HasSubstr(StoreName(coordinator_))))
      << children[1]->output();
  // A new trainer on node 1 cannot be placed: the error names the coordinator.
  Child late([&](FILE* out) {
    ClientOptions o;
    o.socket_path = Socket(1);
    o.job_id = "another";
    o.rank = 0;
    o.world_size = 2;
    auto c = Client::Connect(o);
    std::fprintf(out, "ATTACH %s\n", c.status().ToString().c_str());
    return 0;
  });
  EXPECT_EQ(late.Finish(kChildMs), 0);
  EXPECT_THAT(late.output(), AllOf(HasSubstr("ATTACH " + failed), Not(HasSubstr("ATTACH OK")),
                                   HasSubstr(StoreName(coordinator_))))
      << late.output();
#ifdef HSDP_ETCD_BIN
  if (OnEtcd()) {
    // Quorum back: placement works again, with no daemon restarted.
    ASSERT_TRUE(SharedEtcd().Restart(1));
    ASSERT_TRUE(SharedEtcd().Restart(2));
    ASSERT_TRUE(SharedEtcd().WaitHealthy(absl::Seconds(30)).ok()) << SharedEtcd().Logs();
    Child again([&](FILE* out) {
      ClientOptions o;
      o.socket_path = Socket(1);
      o.job_id = "after";
      o.rank = 0;
      o.world_size = 2;
      auto c = Client::Connect(o);
      std::fprintf(out, "ATTACH %s\n", c.status().ToString().c_str());
      return c.ok() ? 0 : 1;
    });
    EXPECT_EQ(again.Finish(kChildMs), 0) << again.output() << Logs();
  }
#endif
}

}  // namespace
}  // namespace hsdp::testing
