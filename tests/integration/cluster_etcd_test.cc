// The cluster on cluster.store: etcd, where it differs from the embedded
// store: no machine whose loss stops the control plane. Real daemons on
// loopback, a real 3-member etcd cluster (etcd_test_cluster.h), forked
// trainers. (The shared cluster tests also run on etcd: etcd_variants.cmake.)
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "cluster_fixture.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSlackMs = 3000;

class ClusterEtcdTest : public ClusterFixture {
 protected:
  void SetUp() override {
    ::setenv("HSDP_TEST_CLUSTER_STORE", "etcd", 1);
    ClusterFixture::SetUp();
    SharedEtcd();  // started before any daemon needs it
  }
  void TearDown() override {
    // The etcd cluster is shared by the tests of this process: bring back
    // what a test killed.
    for (int member : killed_) EXPECT_TRUE(SharedEtcd().Restart(member));
    if (!killed_.empty()) {
      const absl::Status s = SharedEtcd().WaitHealthy(absl::Seconds(30));
      EXPECT_TRUE(s.ok()) << s << SharedEtcd().Logs();
    }
  }
  void KillEtcd(int member) {
    SharedEtcd().Kill(member);
    killed_.push_back(member);
  }
  void RestartEtcd() {
    for (int member : killed_) ASSERT_TRUE(SharedEtcd().Restart(member));
    killed_.clear();
    const absl::Status s = SharedEtcd().WaitHealthy(absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s << SharedEtcd().Logs();
  }
  // Every node in `nodes` sees `alive` nodes alive and reports "ok".
  void ExpectView(const std::vector<int>& nodes, int alive, uint64_t epoch = 0) {
    for (int node : nodes) {
      v1::NodesResponse view;
      ASSERT_TRUE(QueryNodes(Socket(node), &view));
      EXPECT_EQ(view.state(), "ok") << view.DebugString();
      EXPECT_EQ(AliveNodes(view), alive) << view.DebugString();
      if (epoch != 0) {
        EXPECT_EQ(view.epoch(), epoch) << view.DebugString();
      }
    }
  }

  std::vector<int> killed_;
};

int TwoRankJob(Trainer* T, int) {
  Group all;
  if (!MakeGroup(T, {0, 1}, &all)) return Report(T);
  AllReduceCase(T, all, DataType::kFloat32, {}, 5000);
  AllGatherCase(T, all, DataType::kFloat32, 300);
  return Report(T);
}

// The member every daemon talks to first goes down: the others serve; no
// node is lost, the epoch stays, and a new job forms its groups.
TEST_F(ClusterEtcdTest, OneEtcdMemberDownNothingNotices) {
  StartCluster(2);
  v1::NodesResponse before;
  ASSERT_TRUE(QueryNodes(Socket(0), &before));
  KillEtcd(0);
  // Two lease lifetimes: a renewal that failed over too slowly would have
  // cost a node its membership by now.
  absl::SleepFor(absl::Milliseconds(2 * kHeartbeatMs * kMissed + 500));
  ExpectView({0, 1}, 2, before.epoch());
  RunRanks({0, 1}, TwoRankJob);
  for (int node : {0, 1}) EXPECT_THAT(daemons_[node]->log(), Not(HasSubstr("was lost")));
}

// Node 0 is no coordinator: when it dies, the others notice, stay "ok",
// form a new group without it, and it joins again when restarted.
TEST_F(ClusterEtcdTest, NodeZeroDiesTheOthersGoOnAndFormGroupsWithoutIt) {
  StartCluster(3);
  v1::NodesResponse before;
  ASSERT_TRUE(QueryNodes(Socket(1), &before));
  const std::string yaml0 = ReadFile(daemons_[0]->dir.File("node.yaml"));
  daemons_[0]->process.Kill();
  for (int node : {1, 2}) {
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually(
        // On etcd the loss (a deleted key) and the epoch's step (the
        // successor's compare-and-put) are two watch events: wait for both.
        [&] { return QueryNodes(Socket(node), &view) && StateOf(view, 0) == "lost" &&
                     view.epoch() > before.epoch(); },
        kHeartbeatMs * kMissed + kSlackMs))
        << view.DebugString() << Logs();
    EXPECT_EQ(view.state(), "ok");
  }
  RunRanks({1, 2}, TwoRankJob);
  // Node 0 comes back with its rank (it asks for 0; its address held it).
  ClusterDaemon again;
  ASSERT_FALSE(yaml0.empty());
  ASSERT_TRUE(again.process.Start(yaml0, {}, {}, /*wait_ready=*/true)) << again.log();
  v1::NodesResponse view;
  EXPECT_TRUE(Eventually(
      [&] { return QueryNodes(Socket(1), &view) && AliveNodes(view) == 3; }, kFormMs))
      << view.DebugString();
  ASSERT_TRUE(QueryNodes(again.socket(), &view));
  EXPECT_EQ(view.node_rank(), 0);
}

// etcd loses its quorum: the running group goes on (the data plane does not
// use the store); membership is "degraded" naming etcd; when the quorum
// returns, the cluster is "ok" again with no node lost.
TEST_F(ClusterEtcdTest, WithoutQuorumRunningCollectivesGoOnAndTheClusterRecovers) {
  StartCluster(2);
  const std::string formed = shared_.File("formed");
  const std::string go = shared_.File("go");
  const std::string job = job_;
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < 2; ++r) {
    const std::string socket = Socket(r);
    children.push_back(std::make_unique<Child>([=](FILE* out) {
      Trainer T;
      T.out = out;
      if (!Attach(&T, socket, job, r, 2)) return 2;
      Group all;
      if (!MakeGroup(&T, {0, 1}, &all)) return 2;
      AllReduceCase(&T, all, DataType::kFloat32, {}, 1000);
      WriteFile(formed + std::to_string(r), "");
      if (!WaitFile(go, kChildMs)) return 4;
      for (int i = 0; i < 20; ++i) AllReduceCase(&T, all, DataType::kFloat32, {}, 1000);
      return Report(&T);
    }));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFile(formed + std::to_string(r), kChildMs)) << children[r]->output() << Logs();
  }
  KillEtcd(1);
  KillEtcd(2);
  for (int node : {0, 1}) {
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually(
        [&] { return QueryNodes(Socket(node), &view) && view.state() == "degraded"; },
        kHeartbeatMs * kMissed + 2 * kSlackMs))
        << view.DebugString() << Logs();
    EXPECT_THAT(view.detail(), HasSubstr("etcd ("));
  }
  WriteFile(go, "");  // collectives while etcd has no quorum
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(children[r]->Finish(kChildMs), 0) << children[r]->output() << Logs();
  }
  RestartEtcd();
  for (int node : {0, 1}) {
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually(
        [&] { return QueryNodes(Socket(node), &view) && view.state() == "ok" &&
                     AliveNodes(view) == 2; },
        kFormMs))
        << view.DebugString() << Logs();
    EXPECT_THAT(daemons_[node]->log(), HasSubstr("no longer degraded"));
  }
  job_ = "after-quorum";
  RunRanks({0, 1}, TwoRankJob);
}

// The key/value store on etcd: the embedded store's limits and status codes.
TEST_F(ClusterEtcdTest, TheStoreHasTheEmbeddedStoresLimitsAndErrors) {
  etcd::EtcdOptions options;
  options.endpoints = SharedEtcd().endpoints();
  auto client = etcd::EtcdClient::Connect(options, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  KvLimits limits;
  limits.max_keys = 8;
  EtcdStore store(client->get(), absl::StrCat("/hsdp-test/", ::getpid(), "/store/"), limits);
  const absl::Duration t = absl::Seconds(5);
  EXPECT_EQ(store.Set("", "v", t).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(std::string(limits.max_key_bytes + 1, 'k'), "v", t).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("big", std::string(limits.max_value_bytes + 1, 'v'), t).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Get("absent", t).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set("a", "1", t).ok());
  EXPECT_EQ(*store.Get("a", t), "1");
  EXPECT_EQ(*store.Add("a", 41, t), 42);
  EXPECT_EQ(*store.Add("fresh", -5, t), -5);
  ASSERT_TRUE(store.Set("text", "x", t).ok());
  EXPECT_EQ(store.Add("text", 1, t).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Set("max", absl::StrCat(INT64_MAX), t).ok());
  EXPECT_EQ(store.Add("max", 1, t).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*store.SetIfAbsent("first", "one", t), "one");
  EXPECT_EQ(*store.SetIfAbsent("first", "two", t), "one");
  // 7 keys now (a, fresh, text, max, first + 2 below): the 9th is refused.
  ASSERT_TRUE(store.Set("k6", "", t).ok());
  ASSERT_TRUE(store.Set("k7", "", t).ok());
  ASSERT_TRUE(store.Set("k8", "", t).ok());
  const absl::Status full = store.Set("k9", "", t);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(full.message(), AllOf(HasSubstr("full"), HasSubstr("etcd (")));
  EXPECT_TRUE(store.Set("a", "updates need no room", t).ok());
  ASSERT_TRUE(store.Delete({"k6", "k7", "k8", "never"}, t).ok());
  EXPECT_EQ(store.Get("k6", t).status().code(), absl::StatusCode::kNotFound);
  // Wait: times out naming the key; returns the values once they exist.
  const absl::Status late = store.Wait({"w1"}, absl::Milliseconds(300));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_THAT(late.message(), HasSubstr("w1"));
  std::vector<std::string> many(limits.max_wait_keys + 1, "x");
  EXPECT_EQ(store.Wait(many, t).code(), absl::StatusCode::kInvalidArgument);
  // Deleting is bounded as on the coordinator (kv_limits.h; etcd's store had
  // no bound), and refused before anything is removed.
  const absl::Status too_many = store.Delete(many, t);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_THAT(too_many.message(), HasSubstr("deleting 1025 keys"));
  EXPECT_EQ(store.Barrier("b", 0, t).code(), absl::StatusCode::kInvalidArgument);
  // The same words as the coordinator's store for the same mistake.
  EXPECT_THAT(std::string(store.Add("text", 1, t).status().message()),
              HasSubstr("does not hold an integer counter"));
  // The key is set once the wait read the keys and watches for the rest, so
  // the value reaches it through the watch.
  std::thread setter([&] {
    EXPECT_TRUE(Eventually([&] { return store.watching_count() == 1; }, 5000, 1));
    EXPECT_TRUE(store.Set("w2", "late value", t).ok());
  });
  absl::StatusOr<std::vector<std::string>> values = store.WaitValues({"a", "w2"}, t);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"updates need no room", "late value"}));
  // Pending waits are bounded on each node, as on the coordinator.
  {
    KvLimits one = limits;
    one.max_waiters = 1;
    EtcdStore small(client->get(), absl::StrCat("/hsdp-test/", ::getpid(), "/store/"), one);
    std::thread waiter([&] {
      EXPECT_EQ(small.Wait({"never"}, absl::Seconds(4)).code(),
                absl::StatusCode::kDeadlineExceeded);
    });
    // Once the waiter holds the one slot, other waits are refused at once.
    EXPECT_TRUE(Eventually([&] { return small.waiter_count() == 1; }, 3000));
    EXPECT_EQ(small.Wait({"never"}, t).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(small.Barrier("nb", 2, t).code(), absl::StatusCode::kResourceExhausted);
    waiter.join();
  }
  // Concurrent adds all count; a barrier releases every caller together.
  // The barrier waits longer than `t`: the 40 contended adds before it
  // (compare-and-put retries) can spread the callers' arrivals over
  // seconds on a loaded machine (a CI run: all four timed out at 5 s).
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 10; ++j) EXPECT_TRUE(store.Add("a2", 1, t).ok());
      const absl::Status s = store.Barrier("b", 4, absl::Seconds(60));
      EXPECT_TRUE(s.ok()) << s;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(*store.Get("a2", t), "40");
  EXPECT_EQ(store.Barrier("b", 3, t).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status alone = store.Barrier("b", 4, absl::Milliseconds(300));
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  // The caller that timed out left: four new callers complete a generation.
  threads.clear();
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] { EXPECT_TRUE(store.Barrier("b", 4, t).ok()); });
  }
  for (auto& th : threads) th.join();
}

// Keys a dead node left are cleaned by its lease.
TEST_F(ClusterEtcdTest, KeysOfADeadNodeGoWithItsLease) {
  etcd::EtcdOptions options;
  options.endpoints = SharedEtcd().endpoints();
  auto client = etcd::EtcdClient::Connect(options, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  EtcdStore store(client->get(), absl::StrCat("/hsdp-test/", ::getpid(), "/lease/"));
  absl::StatusOr<int64_t> lease = (*client)->LeaseGrant(absl::Seconds(1), absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  store.SetLease(*lease);
  ASSERT_TRUE(store.Set("gloo/addr", "x", absl::Seconds(5)).ok());
  ASSERT_TRUE(store.PutUnleased("hint", "y", absl::Seconds(5)).ok());
  // Nobody renews the lease: etcd removes the leased key, not the hint.
  EXPECT_TRUE(Eventually(
      [&] { return store.Get("gloo/addr", absl::Seconds(1)).status().code() ==
                   absl::StatusCode::kNotFound; },
      10000));
  EXPECT_EQ(*store.Get("hint", absl::Seconds(5)), "y");
}

// Credentials and prefixes that etcd refuses stop the daemon with a message
// naming etcd and what to fix.
TEST(ClusterEtcdAuthTest, WrongCredentialsAndAWrongPrefixGiveClearErrors) {
  EtcdTestCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ASSERT_TRUE(etcd.EnableAuth("root-secret").ok());
  for (const std::string& args :
       {std::string("role add hsdp-a"),
        std::string("role grant-permission hsdp-a --prefix=true readwrite /hsdp/a/"),
        std::string("user add 'hsdp:hsdp-secret'"), std::string("user grant-role hsdp hsdp-a")}) {
    const absl::Status s = etcd.Etcdctl(args);
    ASSERT_TRUE(s.ok()) << s;
  }
  TempDir dir;
  const std::string right = WriteToken(dir, "right", "hsdp-secret");
  const std::string wrong = WriteToken(dir, "wrong", "guess");
  const auto yaml = [&](const std::string& password_file, const std::string& prefix) {
    return absl::StrCat("cluster:\n  store: etcd\n  etcd:\n    endpoints: [\"", etcd.endpoint(0),
                        "\"]\n    prefix: \"", prefix, "\"\n    user: hsdp\n    password_file: \"",
                        password_file, "\"\n  listen: \"", Loopback(FreePort()),
                        "\"\n  nodes: 1\n  join_timeout_ms: 5000\n");
  };
  {
    ClusterDaemon d;
    ASSERT_TRUE(d.process.Start(yaml(wrong, "/hsdp/a/"), {}, {}, /*wait_ready=*/false));
    EXPECT_NE(d.process.WaitForExit(15000), 0);
    EXPECT_THAT(d.log(), AllOf(HasSubstr("cluster.etcd"), HasSubstr("etcd ("),
                               HasSubstr("authentication failed")))
        << d.log();
  }
  {
    ClusterDaemon d;
    ASSERT_TRUE(d.process.Start(yaml(right, "/hsdp/b/"), {}, {}, /*wait_ready=*/false));
    EXPECT_NE(d.process.WaitForExit(15000), 0);
    EXPECT_THAT(d.log(), AllOf(HasSubstr("permission denied"), HasSubstr("/hsdp/b/")))
        << d.log();
  }
  {
    ClusterDaemon d;
    ASSERT_TRUE(d.process.Start(yaml(right, "/hsdp/a/"), {}, {}, /*wait_ready=*/true)) << d.log();
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually([&] { return QueryNodes(d.socket(), &view) && view.state() == "ok"; },
                           kFormMs))
        << view.DebugString() << d.log();
  }
}

// cluster.etcd.tls against an etcd that serves TLS and requires client
// certificates: with ca, cert and key the daemon joins; with the CA alone (no
// client certificate) or in plaintext it is refused, and the error names etcd.
TEST(ClusterEtcdTlsTest, ClientCertificatesAgainstAnEtcdThatRequiresThem) {
  if (::system("command -v openssl >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl CLI";
  TempDir certs;
  ASSERT_EQ(MakeTestCertificates(certs), "");
  EtcdTestCluster etcd(1);
  etcd.UseTls(certs.File("ca.pem"), certs.File("node.pem"), certs.File("node.key"));
  const absl::Status started = etcd.Start();
  ASSERT_TRUE(started.ok()) << started << etcd.Logs();
  const auto yaml = [&](const std::string& tls) {
    return absl::StrCat("cluster:\n  store: etcd\n  etcd:\n    endpoints: [\"", etcd.endpoint(0),
                        "\"]\n    prefix: /hsdp/tls/\n", tls, "  listen: \"",
                        Loopback(FreePort()), "\"\n  nodes: 2\n  join_timeout_ms: 3000\n");
  };
  {
    ClusterDaemon d;
    ASSERT_TRUE(d.process.Start(
        yaml(absl::StrCat("    tls: {ca: ", certs.File("ca.pem"), ", cert: ", certs.File("node.pem"),
                          ", key: ", certs.File("node.key"), "}\n")),
        {}, {}, /*wait_ready=*/true))
        << d.log();
    v1::NodesResponse view;
    EXPECT_TRUE(Eventually([&] { return QueryNodes(d.socket(), &view) && view.state() == "ok"; },
                           kFormMs))
        << view.DebugString() << d.log();
    EXPECT_THAT(d.log(), HasSubstr("joined through etcd"));
  }
  for (const std::string& tls :
       {absl::StrCat("    tls: {ca: ", certs.File("ca.pem"), "}\n"), std::string()}) {
    ClusterDaemon d;
    const std::string config = yaml(tls) + (tls.empty() ? "  insecure: true\n" : "");
    ASSERT_TRUE(d.process.Start(config, {}, {}, /*wait_ready=*/false));
    EXPECT_NE(d.process.WaitForExit(20000), 0) << d.log();
    EXPECT_THAT(d.log(), AllOf(HasSubstr("cannot join the cluster"), HasSubstr("etcd (")))
        << config << d.log();
  }
}

}  // namespace
}  // namespace hsdp::testing
