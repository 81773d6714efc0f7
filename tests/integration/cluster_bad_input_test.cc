// Hostile and malformed input to a running cluster of real daemons: peer
// RPCs that name ranks, nodes, epochs or members that do not exist, values
// written by hand into the coordinator's placement keys, trainers asking for
// groups of ranks that are out of range or never attach. Each gets a clear
// error naming what is wrong, and the cluster keeps working afterwards (a
// cross-node group still runs and checks its result). Authentication
// failures (no token, a wrong token, no client certificate) are covered by
// cluster_membership_test.
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"

namespace hsdp {
// daemon/dataplane/group.h (its hsdp::Group would clash with the client's):
// the global key every daemon derives for the k-th group with `ranks`.
std::string GroupKey(const JobKey& job, const std::vector<int>& ranks, int k);
}  // namespace hsdp

namespace hsdp::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kToken[] = "cluster datapath test token";  // the fixture's token
constexpr absl::Duration kRpc = absl::Seconds(5);

class ClusterBadInputTest : public ClusterFixture {
 protected:
  // Runs `body` as a peer holding the cluster token, in a child process
  // (gRPC must not run in this process before it forks the trainers: its
  // threads do not survive fork), and returns what it printed.
  std::string AsPeer(const std::function<void(ClusterClient&, FILE*)>& body) {
    const std::string coordinator = coordinator_;
    Child peer([&](FILE* out) {
      ClusterClient client(coordinator, kToken);
      body(client, out);
      return 0;
    });
    EXPECT_EQ(peer.Finish(kChildMs), 0) << peer.output();
    return peer.output();
  }

  // Two trainers (rank 0 on node 0, rank 1 on node 1) of `job` run a
  // cross-node all-reduce and check it: the cluster still works.
  void ExpectClusterWorks(const std::string& job) {
    job_ = job;
    RunRanks({0, 1}, [](Trainer* T, int) {
      Group g;
      if (!MakeGroup(T, {0, 1}, &g)) return Report(T);
      AllReduceCase(T, g, DataType::kFloat32, {}, 10000);
      return Report(T);
    });
  }
};

// Peer RPCs with out-of-range or unknown fields are refused with a message
// naming the field; nothing they name changes.
TEST_F(ClusterBadInputTest, PeerRpcsNamingUnknownNodesEpochsOrRanksAreRefused) {
  StartCluster(2);
  const std::string out = AsPeer([](ClusterClient& peer, FILE* out) {
    auto print = [&](const std::string& what, const absl::Status& s) {
      std::fprintf(out, "%s -> %s\n", what.c_str(), s.ToString().c_str());
    };
    v1::ReportRequest report;
    report.set_node_rank(1);
    report.set_instance("not-the-instance-of-node-1");
    v1::GroupEvent* e = report.add_events();
    e->set_group_key(GroupKey(JobKey{::geteuid(), "nobody's job"}, {0, 1}, 0));
    for (uint32_t epoch : {0u, kMaxGroupEpoch, 0xffffffffu}) {
      e->set_epoch(epoch);
      print("REPORT epoch " + std::to_string(epoch), peer.Report(report, kRpc));
    }
    e->set_epoch(1);
    for (int rank : {1, 99, -5}) {  // well-formed events from non-members
      report.set_node_rank(rank);
      print("REPORT node " + std::to_string(rank), peer.Report(report, kRpc));
    }
    v1::HeartbeatRequest hb;
    hb.set_instance("forged");
    for (int rank : {-1, 1, 2, 1 << 30}) {
      hb.set_node_rank(rank);
      print("HEARTBEAT node " + std::to_string(rank), peer.Heartbeat(hb, kRpc).status());
    }
    v1::JoinRequest join;
    join.set_address("127.0.0.1:1");
    join.set_instance("intruder");
    join.set_nodes(2);
    for (int rank : {2, 7, -2, 1}) {  // out of range, and held by a live node
      join.set_requested_rank(rank);
      print("JOIN rank " + std::to_string(rank), peer.Join(join, kRpc).status());
    }
    join.set_requested_rank(-1);
    join.set_nodes(5);  // disagrees with the cluster
    print("JOIN nodes 5", peer.Join(join, kRpc).status());
  });
  for (const char* epoch : {"0", "1073741824", "4294967295"}) {
    EXPECT_THAT(out, ::testing::ContainsRegex(absl::StrCat(
                         "REPORT epoch ", epoch, " -> INVALID_ARGUMENT: [^\n]*out of range")))
        << out;
  }
  for (const char* node : {"1", "99", "-5"}) {
    EXPECT_THAT(out, ::testing::ContainsRegex(absl::StrCat(
                         "REPORT node ", node, " -> FAILED_PRECONDITION: [^\n]*not a live member")))
        << out;
  }
  for (const char* node : {"-1", "1", "2", "1073741824"}) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("HEARTBEAT node ", node, " -> FAILED_PRECONDITION")))
        << out;
  }
  for (const char* rank : {"2", "7", "-2"}) {
    EXPECT_THAT(out, ::testing::ContainsRegex(absl::StrCat(
                         "JOIN rank ", rank, " -> INVALID_ARGUMENT: [^\n]*out of range")))
        << out;
  }
  EXPECT_THAT(out, HasSubstr("JOIN rank 1 -> ALREADY_EXISTS")) << out;
  EXPECT_THAT(out, HasSubstr("JOIN nodes 5 -> FAILED_PRECONDITION")) << out;

  // Both daemons still see two live nodes in one epoch, and a group runs.
  for (int node : {0, 1}) {
    v1::NodesResponse view;
    ASSERT_TRUE(QueryNodes(Socket(node), &view));
    EXPECT_EQ(AliveNodes(view), 2) << view.DebugString();
    EXPECT_EQ(view.state(), "ok") << view.DebugString();
  }
  ExpectClusterWorks("after-peer-rpcs");
}

// Placement values and epoch hints written by hand into the coordinator's
// store (by a peer that holds the token, or a corrupted store) are never
// trusted: a group that needs them fails naming the key's value, and the
// same group forms once the value is gone.
TEST_F(ClusterBadInputTest, HandWrittenPlacementAndEpochValuesAreRefused) {
  StartCluster(2);
  // The trainers below attach as this test's uid: the jobs' owner.
  const std::string bad_node_job = "bad-node";
  const std::string epoch_job = "bad-epoch";
  const std::string epoch_key = GroupEpochKey(GroupKey(JobKey{::geteuid(), epoch_job}, {0, 1}, 0));
  const std::string set = AsPeer([&](ClusterClient& peer, FILE* out) {
    // Rank 1 of "bad-node" is "placed" on node 99 of a 2-node cluster.
    std::fprintf(
        out, "SET %s\n",
        peer.Set(JobPlacementPrefix(JobKey{::geteuid(), bad_node_job}) + "rank/1", "99", kRpc).ToString().c_str());
    // The first cross-node group {0, 1} of "bad-epoch" would start in an
    // epoch that wraps the daemons' counters.
    std::fprintf(out, "SET %s\n", peer.Set(epoch_key, "4294967295", kRpc).ToString().c_str());
  });
  ASSERT_EQ(set, "SET OK\nSET OK\n");

  job_ = bad_node_job;
  const std::string socket0 = Socket(0);
  Child lone([=](FILE* out) {
    Trainer T;
    T.out = out;
    if (!Attach(&T, socket0, bad_node_job, 0, 2)) return 2;
    absl::StatusOr<Group> g = T.client->NewGroup({0, 1});
    std::fprintf(out, "NEWGROUP %s\n", g.status().ToString().c_str());
    return 0;
  });
  ASSERT_EQ(lone.Finish(kChildMs), 0) << lone.output() << Logs();
  EXPECT_THAT(lone.output(),
              AllOf(HasSubstr("NEWGROUP INTERNAL"), HasSubstr("invalid node"), HasSubstr("\"99\"")))
      << lone.output();

  // Both trainers of "bad-epoch" are refused, then succeed once the hint is
  // deleted (the refused call is not counted: the retry is the same group).
  job_ = epoch_job;
  const std::string cleared = shared_.File("cleared");
  const std::string refused = shared_.File("refused");
  std::vector<std::unique_ptr<Child>> pair;
  for (int r = 0; r < 2; ++r) {
    const std::string socket = Socket(r);
    pair.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      T.world = 2;
      if (!Attach(&T, socket, epoch_job, r, 2)) return 2;
      absl::StatusOr<Group> first = T.client->NewGroup({0, 1});
      std::fprintf(out, "FIRST %s\n", first.status().ToString().c_str());
      WriteFile(refused + std::to_string(r), "");
      if (!WaitFile(cleared, kChildMs)) return 4;
      Group g;
      if (!MakeGroup(&T, {0, 1}, &g)) return Report(&T);
      std::fprintf(out, "EPOCH %u\n", g.epoch);
      AllReduceCase(&T, g, DataType::kFloat32, {}, 3000);
      Sync(&T, "ran");
      return Report(&T);
    }));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFile(refused + std::to_string(r), kChildMs)) << pair[r]->output() << Logs();
  }
  ASSERT_EQ(AsPeer([&](ClusterClient& peer, FILE* out) {
              std::fprintf(out, "%s", peer.Delete({epoch_key}, kRpc).ToString().c_str());
            }),
            "OK");
  WriteFile(cleared, "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(pair[r]->Finish(kChildMs), 0) << pair[r]->output() << Logs();
    EXPECT_THAT(pair[r]->output(), AllOf(HasSubstr("FIRST INTERNAL"), HasSubstr("invalid epoch"),
                                         HasSubstr("EPOCH 1")))
        << pair[r]->output();
  }
}

// Trainers in a cluster asking for impossible groups: ranks outside the
// world, duplicates, a group without the caller, and ranks nobody attaches
// anywhere (an unknown job's ranks). The first three fail at once, before
// any network wait; the last within cluster.join_timeout_ms, naming the
// ranks. A world size that differs from the job's on another node is
// refused at Attach.
TEST_F(ClusterBadInputTest, TrainersAskingForImpossibleGroupsGetClearErrors) {
  StartCluster(2, /*collective_ms=*/15000, /*join_timeout_ms=*/2000);
  const std::string s0 = Socket(0), s1 = Socket(1);
  const std::string release = shared_.File("release");
  Child bad([=](FILE* out) {
    Trainer T;
    T.out = out;
    if (!Attach(&T, s0, "impossible", 0, 4)) return 2;
    auto show = [&](const char* what, const std::vector<int>& ranks) {
      const int64_t start = NowMs();
      absl::StatusOr<Group> g = T.client->NewGroup(ranks);
      std::fprintf(out, "%s %s (%lld ms)\n", what, g.status().ToString().c_str(),
                   static_cast<long long>(NowMs() - start));
    };
    show("OUTSIDE", {0, 4});
    show("NEGATIVE", {0, -1});
    show("HUGE", {0, 1 << 30});
    show("DUPLICATE", {0, 1, 1});
    show("NOTME", {1, 2});
    show("NEVER", {0, 2, 3});  // ranks 2 and 3 of this job never attach
    std::fprintf(out, "SHOWN\n");
    // Stay attached (the job keeps its world size) until the parent is done.
    return WaitFile(release, kChildMs) ? 0 : 4;
  });
  ASSERT_TRUE(bad.WaitFor("SHOWN", kChildMs)) << bad.output() << Logs();
  const std::string out = bad.output();
  EXPECT_THAT(out, HasSubstr("OUTSIDE INVALID_ARGUMENT")) << out;
  EXPECT_THAT(out, HasSubstr("NEGATIVE INVALID_ARGUMENT")) << out;
  EXPECT_THAT(out, HasSubstr("HUGE INVALID_ARGUMENT")) << out;
  EXPECT_THAT(out, AllOf(HasSubstr("DUPLICATE INVALID_ARGUMENT"), HasSubstr("twice"))) << out;
  EXPECT_THAT(out, AllOf(HasSubstr("NOTME INVALID_ARGUMENT"), HasSubstr("only members"))) << out;
  EXPECT_THAT(out, AllOf(HasSubstr("NEVER DEADLINE_EXCEEDED"), HasSubstr("did not attach"))) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("rank\\(s\\) [23], [23] of job")) << out;

  // Rank 1 of the same job on node 1 with another world size is refused.
  Child mismatch([=](FILE* out) {
    ClientOptions o;
    o.socket_path = s1;
    o.job_id = "impossible";
    o.rank = 1;
    o.world_size = 8;
    std::fprintf(out, "ATTACH %s\n", Client::Connect(o).status().ToString().c_str());
    return 0;
  });
  ASSERT_EQ(mismatch.Finish(kChildMs), 0);
  EXPECT_THAT(mismatch.output(), AllOf(HasSubstr("ATTACH INVALID_ARGUMENT"),
                                       HasSubstr("world size 4"), HasSubstr("says 8")))
      << mismatch.output();
  WriteFile(release, "");
  ASSERT_EQ(bad.Finish(kChildMs), 0) << bad.output() << Logs();
  ExpectClusterWorks("after-bad-groups");
}

}  // namespace
}  // namespace hsdp::testing
