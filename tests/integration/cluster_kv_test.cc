// The coordinator's key/value store through its RPCs, from clients standing
// in for two daemons of a running cluster: set/get/wait/add/barrier, and a
// flood that ends in RESOURCE_EXHAUSTED while the cluster keeps working.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "cluster_test_util.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/nccl_id_exchange.h"
#include "daemon/cluster/token_authenticator.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/v1/cluster.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "kv-test-secret";

class ClusterKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_ = WriteToken(shared_, "token", kToken);
    coordinator_ = Loopback(FreePort());
    member_listen_ = Loopback(FreePort());
    ASSERT_TRUE(coord_.process.Start(ClusterYaml(coordinator_, coordinator_, 2, token_)))
        << coord_.log();
    ASSERT_TRUE(member_.process.Start(ClusterYaml(coordinator_, member_listen_, 2, token_)))
        << member_.log();
    ASSERT_TRUE(Formed()) << coord_.log() << member_.log();
  }

  // The Wait and Barrier calls the coordinator's key/value store holds now
  // (`hsdpctl nodes`), -1 when the daemon does not answer.
  int64_t KvWaiters() {
    v1::NodesResponse r;
    return QueryNodes(coord_.socket(), &r) ? static_cast<int64_t>(r.kv_waiters()) : -1;
  }

  bool Formed() {
    v1::NodesResponse a, b;
    return Eventually([&] {
      return QueryNodes(coord_.socket(), &a) && QueryNodes(member_.socket(), &b) &&
             a.state() == "ok" && b.state() == "ok" && AliveNodes(a) == 2 &&
             AliveNodes(b) == 2;
    }, 10000);
  }

  TempDir shared_;
  std::string token_, coordinator_, member_listen_;
  ClusterDaemon coord_, member_;
};

TEST_F(ClusterKvTest, SetGetWaitAddBarrierAcrossNodes) {
  ClusterClient node0(coordinator_, kToken);
  ClusterClient node1(coordinator_, kToken);
  const absl::Duration t = absl::Seconds(5);

  ASSERT_TRUE(node0.Set("gloo/addr/0", std::string("\0\x01tcp://127.0.0.1:1", 19), t).ok());
  absl::StatusOr<std::string> v = node1.Get("gloo/addr/0", t);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("\0\x01tcp://127.0.0.1:1", 19));
  EXPECT_EQ(node1.Get("absent", t).status().code(), absl::StatusCode::kNotFound);

  // Wait blocks until the other node sets the key.
  std::atomic<bool> waited{false};
  absl::Status wait_status;
  std::thread waiter([&] {
    wait_status = node1.Wait({"nccl/uid", "gloo/addr/0"}, absl::Seconds(5));
    waited = true;
  });
  // The coordinator holds the wait before the key is set.
  EXPECT_EQ(EventuallyEq([&] { return KvWaiters(); }, 1, 5000), 1);
  EXPECT_FALSE(waited.load());
  ASSERT_TRUE(node0.Set("nccl/uid", "uid", t).ok());
  waiter.join();
  EXPECT_TRUE(wait_status.ok()) << wait_status;

  // A wait that cannot succeed ends at its timeout, not later.
  const int64_t start = NowMs();
  const absl::Status late = node0.Wait({"never"}, absl::Milliseconds(300));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_LT(NowMs() - start, 3000);

  // Add is atomic across callers.
  std::vector<std::thread> adders;
  for (ClusterClient* c : {&node0, &node1}) {
    adders.emplace_back([c, t] {
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(c->Add("counter", 2, t).ok());
    });
  }
  for (auto& a : adders) a.join();
  EXPECT_EQ(*node0.Add("counter", 0, t), 200);

  // Barrier: three callers from two nodes, used twice.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> threads;
    std::atomic<int> ok{0};
    for (ClusterClient* c : {&node0, &node1, &node1}) {
      threads.emplace_back([c, &ok] { ok += c->Barrier("init", 3, absl::Seconds(5)).ok(); });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(ok.load(), 3) << "round " << round;
  }
  EXPECT_EQ(node0.Barrier("alone", 2, absl::Milliseconds(200)).code(),
            absl::StatusCode::kDeadlineExceeded);

  // A member daemon's listener is not the coordinator, and says where it is.
  ClusterClient wrong_node(member_listen_, kToken);
  const absl::Status s = wrong_node.Set("k", "v", t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(coordinator_));
}

// The NCCL unique-id exchange of device groups that span nodes, through
// the real coordinator: the creator's id reaches a daemon that waited for
// it, the key is gone once both read it, and a value of the wrong size is
// refused before NCCL could see it.
TEST_F(ClusterKvTest, NcclIdExchangeThroughTheCoordinator) {
  ClusterClient node0(coordinator_, kToken);
  ClusterClient node1(coordinator_, kToken);
  auto creator = MakeNcclIdExchange(&node0);
  auto waiter = MakeNcclIdExchange(&node1);
  nccl::UniqueId mine;
  for (size_t i = 0; i < mine.bytes.size(); ++i) mine.bytes[i] = static_cast<uint8_t>(i * 7);
  const std::string key = "6:xjob/0,1#0#1";
  absl::StatusOr<nccl::UniqueId> got;
  std::thread wait([&] {
    got = waiter(key, false, nccl::UniqueId{}, 2, absl::Now() + absl::Seconds(10));
  });
  // The waiter waits first: the coordinator holds its wait for the id.
  EXPECT_EQ(EventuallyEq([&] { return KvWaiters(); }, 1, 5000), 1);
  absl::StatusOr<nccl::UniqueId> made = creator(key, true, mine, 2, absl::Now() + absl::Seconds(10));
  wait.join();
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(made->bytes, mine.bytes);
  EXPECT_EQ(got->bytes, mine.bytes);
  EXPECT_EQ(node0.Get(NcclIdKey(key), absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(node0.Get(NcclIdKey(key) + "/read", absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  // A long group key stays within the store's key limit.
  EXPECT_LE(NcclIdKey(std::string(5000, '7') + "#3").size(), 200u);

  ASSERT_TRUE(node0.Set(NcclIdKey("bad#1"), "short", absl::Seconds(5)).ok());
  absl::StatusOr<nccl::UniqueId> bad =
      waiter("bad#1", false, nccl::UniqueId{}, 2, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("5 bytes")) << bad.status();
  // Nobody creates: the waiter fails at its deadline, naming the coordinator.
  absl::StatusOr<nccl::UniqueId> late =
      waiter("never#1", false, nccl::UniqueId{}, 2, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr(coordinator_)) << late.status();
}

TEST_F(ClusterKvTest, FloodIsResourceExhaustedAndTheClusterKeepsWorking) {
  v1::NodesResponse before;
  ASSERT_TRUE(QueryNodes(member_.socket(), &before));
  ClusterClient flooder(coordinator_, kToken);
  const absl::Duration t = absl::Seconds(5);
  // One oversized value.
  absl::Status s = flooder.Set("huge", std::string((1 << 20) + 1, 'x'), t);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Fill the store with 1 MiB values until it refuses.
  const std::string mib(1 << 20, 'y');
  int stored = 0;
  for (int i = 0; i < 100; ++i) {
    s = flooder.Set(absl::StrCat("flood/", i), mib, t);
    if (!s.ok()) break;
    ++stored;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("full"));
  EXPECT_GT(stored, 10);
  EXPECT_LT(stored, 100);
  // Many keys in one wait are refused too.
  std::vector<std::string> keys;
  for (int i = 0; i < 2000; ++i) keys.push_back(absl::StrCat("w", i));
  EXPECT_EQ(flooder.Wait(keys, absl::Milliseconds(100)).code(),
            absl::StatusCode::kInvalidArgument);

  // Heartbeats and membership are unaffected (the member's heartbeat
  // succeeded after the flood, in the same epoch: never lost and rejoined);
  // reads and barriers still work.
  const int64_t flooded = NowMs();
  EXPECT_TRUE(Eventually([&] { return HeartbeatSince(member_.socket(), flooded); }, 10000))
      << member_.log();
  ASSERT_TRUE(Formed());
  v1::NodesResponse view;
  ASSERT_TRUE(QueryNodes(member_.socket(), &view));
  EXPECT_EQ(AliveNodes(view), 2);
  EXPECT_EQ(view.epoch(), before.epoch()) << "a node was lost and joined again";
  ClusterClient other(coordinator_, kToken);
  EXPECT_TRUE(other.Get("flood/0", t).ok());
  std::thread peer([&] { EXPECT_TRUE(other.Barrier("after", 2, absl::Seconds(5)).ok()); });
  EXPECT_TRUE(flooder.Barrier("after", 2, absl::Seconds(5)).ok());
  peer.join();
}

// 1100 waits pending at once (async client calls): the first 1024 are held
// without a server thread each, the rest are RESOURCE_EXHAUSTED at once, and
// heartbeats, sets and a wait that succeeds keep working meanwhile.
TEST_F(ClusterKvTest, WaiterFloodIsBoundedAndHoldsNoThreads) {
  constexpr int kWaits = 1100;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto stub = v1::Cluster::NewStub(
      grpc::CreateCustomChannel(coordinator_, grpc::InsecureChannelCredentials(), args));
  struct Call {
    grpc::ClientContext ctx;
    v1::KvWaitRequest req;
    v1::KvWaitResponse resp;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int done = 0, exhausted = 0, timed_out = 0;
  for (int i = 0; i < kWaits; ++i) {
    auto call = std::make_unique<Call>();
    call->ctx.AddMetadata(kClusterTokenMetadata, kToken);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
    call->req.add_keys("never-set");
    call->req.set_timeout_ms(2500);
    stub->async()->Wait(&call->ctx, &call->req, &call->resp, [&](grpc::Status s) {
      absl::MutexLock l(&mu);
      ++done;
      exhausted += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      timed_out += s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    });
    calls.push_back(std::move(call));
  }
  // The excess is refused promptly, while the others are still pending.
  {
    absl::MutexLock l(&mu);
    auto excess_refused = [&] { return exhausted >= kWaits - 1024; };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&excess_refused), absl::Seconds(10)))
        << "exhausted " << exhausted << " done " << done;
  }
  ClusterClient client(coordinator_, kToken);
  EXPECT_TRUE(client.Set("during", "flood", absl::Seconds(5)).ok());
  EXPECT_TRUE(client.Wait({"during"}, absl::Seconds(1)).ok());
  v1::NodesResponse view;
  ASSERT_TRUE(QueryNodes(member_.socket(), &view));
  EXPECT_EQ(view.state(), "ok");
  EXPECT_EQ(AliveNodes(view), 2);
  {
    absl::MutexLock l(&mu);
    auto all_done = [&] { return done == kWaits; };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(12)))
        << "done " << done;
    EXPECT_EQ(exhausted, kWaits - 1024);
    EXPECT_EQ(timed_out, 1024);
  }
  ASSERT_TRUE(Formed());
}

}  // namespace
}  // namespace hsdp::testing
