// A cluster whose nodes are network namespaces joined by veth pairs and a
// bridge (tools/scripts/netns_topology.py): each hsdpd runs inside its
// node's namespace on that node's own address, and its trainers (forked
// children) enter the same namespace. Collectives across the namespaces are
// checked against the independent reference of collective_check.h, and the
// bytes are seen crossing a node's veth. Failures: a daemon killed, or a
// node's link taken down, while the others wait in a collective with it —
// their operations fail well within timeouts.collective_ms naming the node
// and its ranks, a group without it keeps working, the epoch advances and
// the survivors form a new group; after the link comes back the node joins
// again and the full group runs in its next epoch. Every wait is bounded.
// Skips (with the reason) where namespaces cannot be created.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster_test_util.h"
#include "cluster_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "netns_util.h"

namespace hsdp::testing {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// The "after N ms" of a trainer's RESULT line, -1 without one.
int64_t ResultMs(const std::string& out) {
  const size_t at = out.find("RESULT ");
  if (at == std::string::npos) return -1;
  const size_t end = out.find('\n', at);
  const std::string line = out.substr(at, end == std::string::npos ? end : end - at);
  const size_t after = line.rfind(" after ");
  return after == std::string::npos ? -1 : std::atoll(line.c_str() + after + 7);
}

// Node i's address; only ever assigned inside the test's own namespaces.
std::string Addr(int node) { return absl::StrCat("198.18.78.", 10 + node); }

class ClusterNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = NetnsUnavailable();
    if (!why.empty()) GTEST_SKIP() << "network namespaces cannot be created here: " << why;
    token_ = WriteToken(shared_, "token", "cluster netns test token");
  }

  // `n` namespaces, a daemon in each (node 0 the coordinator, on port 7070
  // of its own address), every one seeing all of them alive.
  void StartCluster(int n, int collective_ms) {
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) addresses.push_back(Addr(i));
    std::string error;
    ASSERT_TRUE(topo_.Up(addresses, &error)) << error;
    const std::string coordinator = Addr(0) + ":7070";
    for (int i = 0; i < n; ++i) {
      daemons_.push_back(std::make_unique<NetnsDaemon>());
      const std::string yaml = ClusterYaml(coordinator, Addr(i) + ":7070", n, token_) +
                               absl::StrCat("  node_rank: ", i, "\n  data_address: ", Addr(i),
                                            "\ntimeouts:\n  collective_ms: ", collective_ms,
                                            "\nengine:\n  threads: 2\n");
      ASSERT_TRUE(daemons_[i]->Start(topo_.Namespace(i), yaml));
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(daemons_[i]->WaitReady(kFormMs)) << Logs();
    }
    for (int i = 0; i < n; ++i) {
      v1::NodesResponse view;
      ASSERT_TRUE(Eventually([&] { return QueryNodes(Socket(i), &view) && AliveNodes(view) == n; },
                             kFormMs))
          << view.DebugString() << Logs();
    }
  }

  std::string Socket(int node) const { return daemons_[node]->socket(); }
  std::string Logs() const {
    std::string all;
    for (size_t i = 0; i < daemons_.size(); ++i) {
      const std::string log = daemons_[i]->log();
      all += "--- daemon " + std::to_string(i) + " log (tail) ---\n" +
             (log.size() > 5000 ? log.substr(log.size() - 5000) : log);
    }
    return all;
  }

  // A trainer process for global rank `r` inside node `node`'s namespace.
  std::unique_ptr<Child> Spawn(int node, int r, int world,
                               const std::function<int(Trainer*)>& body) {
    const std::string ns = topo_.Namespace(node), socket = Socket(node), job = job_;
    const std::string sync_dir = shared_.path();
    return std::make_unique<Child>([=](FILE* out) {
      if (!EnterNetns(ns)) {
        std::fprintf(out, "cannot enter namespace %s\n", ns.c_str());
        return 9;
      }
      Trainer T;
      T.out = out;
      T.world = world;
      T.sync_dir = sync_dir;
      if (!Attach(&T, socket, job, r, world)) return 2;
      return body(&T);
    });
  }

  // One trainer per rank (rank r on node placement[r]); each must exit 0.
  // Nobody detaches before all are done (that would end the group's epoch).
  void RunRanks(const std::vector<int>& placement, const std::function<int(Trainer*)>& body) {
    const int world = static_cast<int>(placement.size());
    const std::string done = shared_.File("done");
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 0; r < world; ++r) {
      children.push_back(Spawn(placement[r], r, world, [=](Trainer* T) {
        const int rc = body(T);
        WriteFile(done + std::to_string(T->rank), "");
        for (int i = 0; i < world; ++i) {
          if (!WaitFile(done + std::to_string(i), kChildMs)) return 5;
        }
        return rc;
      }));
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(children[r]->Finish(kChildMs), 0)
          << "rank " << r << " on node " << placement[r] << ":\n"
          << children[r]->output() << Logs();
    }
  }

  // The failure scenarios, on 3 nodes: ranks 0 and 3 on node 0, rank 1 on
  // node 1, rank 2 on node 2. Node 2 is disrupted (killed, or its link
  // taken down) while ranks 0, 1 and 3 wait in an all-reduce of the group
  // of all four.
  void FailureScenario(bool link_down);

  TempDir shared_;
  std::string token_;
  std::string job_ = "netnsjob";
  NetnsTopology topo_;  // declared before the daemons: removed after them
  std::vector<std::unique_ptr<NetnsDaemon>> daemons_;
};

// 2 nodes x 2 trainers (ranks {0, 3} on node 0, {1, 2} on node 1): every
// collective, a barrier, point-to-point and the HSDP composite, against the
// reference.
TEST_F(ClusterNetnsTest, CollectivesAcrossNamespacesMatchTheReference) {
  StartCluster(2, /*collective_ms=*/15000);
  const int64_t before = topo_.BytesFrom(1);
  RunRanks({0, 1, 1, 0}, [](Trainer* T) {
    const int rank = T->rank;
    Group all;
    if (!MakeGroup(T, {0, 1, 2, 3}, &all)) return Report(T);
    EveryCollectiveCase(T, all);
    Sync(T, "collectives");
    SendRecvCase(T, all, 0, 1, 7, 3000);  // node 0 -> node 1
    Sync(T, "p2p");
    SendRecvCase(T, all, 2, 3, 7, 100);  // node 1 -> node 0
    Sync(T, "p2p2");
    // HSDP: shard group inside each node, replicate group across.
    const bool node0 = rank == 0 || rank == 3;
    Group shard, replicate;
    if (!MakeGroup(T, node0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2}, &shard) ||
        !MakeGroup(T, rank <= 1 ? std::vector<int>{0, 1} : std::vector<int>{3, 2}, &replicate)) {
      return Report(T);
    }
    for (int bucket = 0; bucket < 2; ++bucket) {
      CompositeCase(T, shard, replicate, {0, 1, 2, 3}, DataType::kFloat32, {}, 1000 + bucket,
                    "netns");
    }
    return Report(T);
  });
  // The 70000-float all-reduce alone moves more than 140 KB out of node 1:
  // the data plane really ran over the veth, not over some shortcut.
  const int64_t sent = topo_.BytesFrom(1) - before;
  EXPECT_GT(sent, 140000) << "bytes from node 1 over its veth: " << sent;
}

void ClusterNetnsTest::FailureScenario(bool link_down) {
  constexpr int kCollectiveMs = 6000;
  StartCluster(3, kCollectiveMs);
  if (HasFatalFailure()) return;
  const std::string formed = shared_.File("formed"), cut = shared_.File("cut");
  const std::string lost = shared_.File("lost"), relinked = shared_.File("relinked");
  const std::vector<int> placement = {0, 1, 2, 0};
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 4; ++r) {
    children.push_back(Spawn(placement[r], r, 4, [=](Trainer* T) {
      Group all, pair, local;
      if (!MakeGroup(T, {0, 1, 2, 3}, &all)) return 2;
      AllReduceCase(T, all, DataType::kFloat32, {}, 2000);
      if (r <= 1 && !MakeGroup(T, {0, 1}, &pair)) return 2;               // nodes 0 and 1 only
      if ((r == 0 || r == 3) && !MakeGroup(T, {3, 0}, &local)) return 2;  // node 0 only
      if (r <= 1) AllReduceCase(T, pair, DataType::kFloat32, {}, 1000);
      if (T->failures > 0) return 2;
      WriteFile(formed + std::to_string(r), "");
      if (r == 2) {
        if (!link_down) {
          ::pause();  // its daemon is killed
          return 0;
        }
        if (!WaitFile(cut, kChildMs)) return 4;  // submits once cut off
      }
      Fill(T, DataType::kFloat32, 200);
      absl::StatusOr<Work> w =
          T->client->AllReduce(all, {T->send.id, 0}, {T->recv.id, 0}, 200, DataType::kFloat32);
      if (!w.ok()) return 3;
      const int64_t start = NowMs();
      const absl::Status s = w->Wait(absl::Seconds(19));
      std::fprintf(T->out, "RESULT %s after %lld ms\n", s.ToString().c_str(),
                   static_cast<long long>(NowMs() - start));
      if (!WaitFile(lost, kChildMs)) return 4;
      if (r != 2) {
        // Later work in the failed epoch names the lost node and its rank.
        absl::StatusOr<Work> again =
            T->client->AllReduce(all, {T->send.id, 0}, {T->recv.id, 0}, 200, DataType::kFloat32);
        if (!again.ok()) return 3;
        std::fprintf(T->out, "AGAIN %s\n", again->Wait(absl::Seconds(19)).ToString().c_str());
        // Groups without node 2 keep working: across nodes 0-1, and inside node 0.
        if (r <= 1) AllReduceCase(T, pair, DataType::kFloat32, {}, 5000);
        if (r == 0 || r == 3) AllReduceCase(T, local, DataType::kFloat32, {}, 5000);
        Group survivors;
        if (!MakeGroup(T, {0, 1, 3}, &survivors)) return Report(T);
        AllReduceCase(T, survivors, DataType::kFloat32, {}, 4000);
        AllGatherCase(T, survivors, DataType::kFloat32, 100);
        std::fprintf(T->out, "SURVIVORS RAN\n");
      }
      if (!link_down) return Report(T);
      // The link is back and node 2 joined again: the group of all four
      // runs in its next epoch.
      if (!WaitFile(relinked, kChildMs)) return 4;
      absl::StatusOr<Group> next = T->client->RejoinGroup(all);
      if (!next.ok()) {
        T->Fail("rejoin: " + next.status().ToString());
        return Report(T);
      }
      std::fprintf(T->out, "REJOINED epoch %u\n", next->epoch);
      AllReduceCase(T, *next, DataType::kFloat32, {}, 3000);
      Sync(T, "after-relink");
      return Report(T);
    }));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(WaitFile(formed + std::to_string(r), kChildMs))
        << "rank " << r << ": " << children[r]->output() << Logs();
  }
  const uint64_t epoch0 = EpochOf(Socket(0));
  ASSERT_GT(epoch0, 0u);
  // The survivors' all-reduce is in flight on nodes 0 and 1.
  for (int node : {0, 1}) {
    ASSERT_TRUE(Eventually([&] { return OpsInDaemon(Socket(node), job_) >= 1; }, kChildMs))
        << "node " << node << Logs();
  }
  const int64_t disrupted = NowMs();
  if (link_down) {
    ASSERT_TRUE(topo_.SetLink(2, false));
    WriteFile(cut, "");
  } else {
    daemons_[2]->Kill();
  }
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(children[r]->WaitFor("RESULT", kChildMs))
        << "rank " << r << ": " << children[r]->output() << Logs();
  }
  const int64_t survivors_failed_ms = NowMs() - disrupted;
  // Both surviving daemons declared node 2 lost, in a newer epoch.
  for (int node : {0, 1}) {
    v1::NodesResponse view;
    ASSERT_TRUE(Eventually(
        [&] {
          return QueryNodes(Socket(node), &view) && StateOf(view, 2) == "lost" &&
                 view.epoch() > epoch0;
        },
        kFormMs))
        << view.DebugString() << Logs();
  }
  const uint64_t epoch_lost = EpochOf(Socket(0));
  if (link_down) {
    // Cut off, node 2 cannot reach the coordinator: it reports the cluster
    // degraded, and its own operation fails at timeouts.collective_ms.
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually(
        [&] { return QueryNodes(Socket(2), &view) && view.state() == "degraded"; }, kFormMs))
        << view.DebugString();
    ASSERT_TRUE(children[2]->WaitFor("RESULT", kChildMs)) << children[2]->output() << Logs();
  }
  WriteFile(lost, "");
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(children[r]->WaitFor("SURVIVORS RAN", kChildMs))
        << "rank " << r << ": " << children[r]->output() << Logs();
  }
  std::printf("%s: the survivors' all-reduce failed %lld ms after the disruption\n",
              link_down ? "link down" : "daemon killed",
              static_cast<long long>(survivors_failed_ms));
  if (link_down) {
    std::printf("node 2 (cut off): %s", children[2]->output().c_str());
    const int64_t relink = NowMs();
    ASSERT_TRUE(topo_.SetLink(2, true));
    // Node 2 hears it was declared lost and joins again, keeping its rank:
    // every view sees three live nodes in a newer epoch.
    for (int node : {0, 1, 2}) {
      v1::NodesResponse view;
      ASSERT_TRUE(Eventually(
          [&] {
            return QueryNodes(Socket(node), &view) && AliveNodes(view) == 3 &&
                   view.state() == "ok" && view.epoch() > epoch_lost;
          },
          kFormMs))
          << "node " << node << ": " << view.DebugString() << Logs();
    }
    std::printf("link up: node 2 joined again after %lld ms\n",
                static_cast<long long>(NowMs() - relink));
    WriteFile(relinked, "");
  }
  for (int r = 0; r < 4; ++r) {
    if (!link_down && r == 2) continue;
    EXPECT_EQ(children[r]->Finish(kChildMs), 0) << "rank " << r << ":\n"
                                                << children[r]->output() << Logs();
  }
  std::printf("rank 1 (node 1):\n%s", children[1]->output().c_str());
  for (int r : {0, 1, 3}) {
    const std::string out = children[r]->output();
    // Failed well within the configured timeout, naming the lost node —
    // through this daemon's own view, or as the report of another survivor
    // that saw it first ("node N reports: <cause>"), relayed by the
    // coordinator.
    EXPECT_THAT(out, ContainsRegex("RESULT (UNAVAILABLE|ABORTED)[^\n]*node 2")) << out;
    EXPECT_LT(survivors_failed_ms, kCollectiveMs) << out;
    EXPECT_THAT(out, AllOf(HasSubstr("AGAIN ABORTED"), HasSubstr("rank(s) [2]"))) << out;
  }
  if (link_down) {
    const std::string out = children[2]->output();
    // Cut off, node 2's own operation fails (never hangs) at the collective
    // timeout: it cannot tell a lost peer from a slow one without the
    // coordinator. Two timers end it at that moment, whichever fires first:
    // the group's deadline, or the engine's (its receive from a silent peer,
    // which then names that peer).
    EXPECT_THAT(out, ContainsRegex("RESULT DEADLINE_EXCEEDED[^\n]*(timeouts.collective_ms|no "
                                   "answer from node [01] before the deadline)"))
        << out;
    const int64_t ms = ResultMs(out);
    EXPECT_GE(ms, kCollectiveMs - 500) << out;
    EXPECT_LE(ms, kCollectiveMs + 2000) << out;
    for (int r = 0; r < 4; ++r) {
      EXPECT_THAT(children[r]->output(), HasSubstr("REJOINED")) << children[r]->output();
    }
  }
}

// A daemon killed mid-collective.
TEST_F(ClusterNetnsTest, DaemonKilledFailsOpsNamingTheNodeAndSurvivorsGoOn) {
  FailureScenario(/*link_down=*/false);
}

// A node's link taken down mid-collective, then up again.
TEST_F(ClusterNetnsTest, LinkDownFailsOpsNamingTheNodeAndTheNodeRejoinsAfterLinkUp) {
  FailureScenario(/*link_down=*/true);
}

}  // namespace
}  // namespace hsdp::testing
