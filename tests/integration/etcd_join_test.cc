// EtcdJoin (daemon/cluster/etcd/etcd_join.h) against a real etcd on loopback
// (etcd_test_cluster.h): the cluster.nodes check, rank claims (distinct,
// by request, a restarted address's rank back, a full cluster, a lease that
// is gone) and the epoch steps.
#include "daemon/cluster/etcd/etcd_join.h"

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "etcd_test_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp::etcd {
namespace {

using ::hsdp::testing::EtcdTestCluster;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

class EtcdJoinTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new EtcdTestCluster(1);
    start_status_ = new absl::Status(cluster_->Start());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_status_;
  }
  void SetUp() override {
    ASSERT_TRUE(start_status_->ok()) << *start_status_;
    EtcdOptions options;
    options.endpoints = cluster_->endpoints();
    auto client = EtcdClient::Connect(options, kTimeout);
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_ = std::move(*client);
    prefix_ = absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
  }

  EtcdJoin Join(const std::string& address, uint32_t nodes, int rank = -1) {
    return EtcdJoin(etcd_.get(),
                    {.prefix = prefix_, .address = address, .nodes = nodes, .node_rank = rank});
  }
  int64_t Lease() {
    absl::StatusOr<int64_t> lease = etcd_->LeaseGrant(absl::Seconds(30), kTimeout);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.value_or(0);
  }
  static v1::ClusterNode Me(const std::string& instance) {
    v1::ClusterNode me;
    me.set_instance(instance);
    me.set_name("n-" + instance);
    return me;
  }
  absl::StatusOr<EtcdJoin::Claimed> Claim(const std::string& address, uint32_t nodes,
                                          int64_t lease, int rank = -1,
                                          const std::string& instance = "i") {
    return Join(address, nodes, rank).Claim(Me(instance), lease, absl::Now() + kTimeout);
  }

  static EtcdTestCluster* cluster_;
  static absl::Status* start_status_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string prefix_;
};
EtcdTestCluster* EtcdJoinTest::cluster_ = nullptr;
absl::Status* EtcdJoinTest::start_status_ = nullptr;

TEST_F(EtcdJoinTest, EveryNodeMustAgreeOnClusterNodes) {
  EXPECT_TRUE(Join("a:1", 4).CheckNodes(absl::Now() + kTimeout).ok());  // forms it
  EXPECT_TRUE(Join("b:1", 4).CheckNodes(absl::Now() + kTimeout).ok());
  const absl::Status s = Join("c:1", 8).CheckNodes(absl::Now() + kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cluster.nodes is 8 here"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("was formed with nodes=4"));
}

TEST_F(EtcdJoinTest, ClaimsTakeDistinctRanksAndStepTheEpoch) {
  std::set<int> ranks;
  uint64_t last_epoch = 0;
  for (const std::string address : {"a:1", "b:1", "c:1"}) {
    absl::StatusOr<EtcdJoin::Claimed> c = Claim(address, 4, Lease());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_GE(c->rank, 0);
    EXPECT_LT(c->rank, 4);
    ranks.insert(c->rank);
    EXPECT_GT(c->epoch, last_epoch);  // every join moves the epoch on
    last_epoch = c->epoch;
    EXPECT_EQ(c->live.size(), ranks.size());  // the others, and itself
    bool self = false;
    for (const v1::ClusterNode& n : c->live) {
      EXPECT_EQ(n.state(), "alive");
      if (n.address() == address) {
        self = true;
        EXPECT_EQ(n.node_rank(), c->rank);
        EXPECT_EQ(n.name(), "n-i");
      }
    }
    EXPECT_TRUE(self);
  }
  EXPECT_EQ(ranks.size(), 3u);
}

TEST_F(EtcdJoinTest, ARestartedAddressGetsItsRankBackAndItsOldLeaseGoes) {
  const int64_t first = Lease();
  absl::StatusOr<EtcdJoin::Claimed> a = Claim("a:1", 8, first);
  ASSERT_TRUE(a.ok()) << a.status();
  // Restarted while its key still lives: the same rank, the old lease revoked.
  const int64_t second = Lease();
  absl::StatusOr<EtcdJoin::Claimed> again = Claim("a:1", 8, second, -1, "i2");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank, a->rank);
  EXPECT_EQ(etcd_->LeaseKeepAlive(first, kTimeout).status().code(), absl::StatusCode::kNotFound);
  // Gone (its lease revoked, the key with it), then back: still its rank.
  ASSERT_TRUE(etcd_->LeaseRevoke(second, kTimeout).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Claim(absl::StrCat("x:", i), 8, Lease()).ok());
  absl::StatusOr<EtcdJoin::Claimed> back = Claim("a:1", 8, Lease(), -1, "i3");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, a->rank);
}

TEST_F(EtcdJoinTest, RequestedRanksConflictsAndAFullCluster) {
  absl::StatusOr<EtcdJoin::Claimed> a = Claim("a:1", 2, Lease(), /*rank=*/1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank, 1);
  absl::StatusOr<EtcdJoin::Claimed> b = Claim("b:1", 2, Lease(), /*rank=*/1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("held by the live node a:1"));
  b = Claim("b:1", 2, Lease());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rank, 0);
  absl::StatusOr<EtcdJoin::Claimed> c = Claim("c:1", 2, Lease());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(EtcdJoinTest, AClaimWithALeaseThatIsGoneIsNotFound) {
  const int64_t lease = Lease();
  ASSERT_TRUE(etcd_->LeaseRevoke(lease, kTimeout).ok());
  EXPECT_EQ(Claim("a:1", 4, lease).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdJoinTest, TheEpochStepsOncePastAChange) {
  EtcdJoin join = Join("a:1", 4);
  absl::StatusOr<int64_t> change = etcd_->Put(prefix_ + "m/nodes/00003", "x", 0, kTimeout);
  ASSERT_TRUE(change.ok()) << change.status();
  const int64_t epoch = join.AdvanceEpochPast(*change);
  EXPECT_EQ(epoch, 1);
  EXPECT_EQ(join.AdvanceEpochPast(*change), 1);  // already past it: no second step
  change = etcd_->Put(prefix_ + "m/nodes/00002", "y", 0, kTimeout);
  ASSERT_TRUE(change.ok());
  EXPECT_EQ(join.AdvanceEpochPast(*change), 2);
}

}  // namespace
}  // namespace hsdp::etcd
