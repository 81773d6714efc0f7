// EtcdJoin (daemon/cluster/etcd/etcd_join.h) against a real etcd on loopback
// (etcd_test_cluster.h): the cluster.nodes check, rank claims (distinct,
// by request, a restarted address's rank back, a full cluster, a lease that
// is gone) and the epoch steps.
#include "daemon/cluster/etcd/etcd_join.h"

#include <memory>
#include <optional>
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
                                          const std::string& instance = "i",
                                          bool want_list = false) {
    return Join(address, nodes, rank).Claim(Me(instance), lease, absl::Now() + kTimeout,
                                            want_list);
  }
  // Rank r's news (P w/news/<r>), nullopt when there is none.
  std::optional<v1::ClusterNode> News(int rank) {
    absl::StatusOr<RangeResult> r = etcd_->Range(EtcdKeys(prefix_).NewsOf(rank), "", kTimeout);
    EXPECT_TRUE(r.ok()) << r.status();
    v1::ClusterNode n;
    if (!r.ok() || r->kvs.empty() || !n.ParseFromString(r->kvs[0].value)) return std::nullopt;
    return n;
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
  // A cluster formed by an hsdpd with another key layout is refused, naming it.
  EtcdJoin other(etcd_.get(), {.prefix = prefix_ + "old/", .address = "d:1", .nodes = 4});
  ASSERT_TRUE(etcd_->Put(prefix_ + "old/m/config", "nodes=4", 0, kTimeout).ok());
  const absl::Status layout = other.CheckNodes(absl::Now() + kTimeout);
  EXPECT_EQ(layout.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(layout.message()), HasSubstr("another key layout"));
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
    ASSERT_EQ(c->live.size(), 1u);  // without want_list: itself alone
    EXPECT_EQ(c->live[0].address(), address);
    EXPECT_FALSE(News(c->rank).has_value()) << "a rank's first holder is no news";
  }
  EXPECT_EQ(ranks.size(), 3u);
  // A join that wants the list (a rejoin) gets every live node.
  absl::StatusOr<EtcdJoin::Claimed> d = Claim("d:1", 4, Lease(), -1, "i", /*want_list=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  ranks.insert(d->rank);
  EXPECT_EQ(d->live.size(), 4u);
  {
    bool self = false;
    for (const v1::ClusterNode& n : d->live) {
      EXPECT_EQ(n.state(), "alive");
      EXPECT_TRUE(ranks.contains(n.node_rank())) << n.DebugString();
      if (n.address() == "d:1") {
        self = true;
        EXPECT_EQ(n.node_rank(), d->rank);
        EXPECT_EQ(n.name(), "n-i");
      }
    }
    EXPECT_TRUE(self);
  }
  EXPECT_EQ(ranks.size(), 4u);
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
  // News for every member: alive, replacing the first instance.
  std::optional<v1::ClusterNode> news = News(a->rank);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->state(), "alive");
  EXPECT_EQ(news->instance(), "i2");
  EXPECT_EQ(news->previous_instance(), "i");
  EXPECT_GE(news->changed_epoch(), a->epoch);
  // Gone (its lease revoked, the key with it), then back: still its rank.
  ASSERT_TRUE(etcd_->LeaseRevoke(second, kTimeout).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Claim(absl::StrCat("x:", i), 8, Lease()).ok());
  absl::StatusOr<EtcdJoin::Claimed> back = Claim("a:1", 8, Lease(), -1, "i3");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, a->rank);
  news = News(a->rank);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->instance(), "i3");
  EXPECT_EQ(news->previous_instance(), "i2");  // its last holder, gone
}

TEST_F(EtcdJoinTest, AClaimReadsAWindowOfRanksNotTheMembership) {
  constexpr uint32_t kNodes = 1000;
  const int64_t lease = Lease();
  std::set<int> ranks;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<EtcdJoin::Claimed> c = Claim(absl::StrCat("h:", i), kNodes, lease);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(ranks.insert(c->rank).second) << "rank " << c->rank << " given twice";
  }
  // One more: at most a few windows of node keys and holder records (a
  // window is 64 ranks; 200 of 1000 are held), never the 200 live nodes'
  // entries and the 200 holder records of a whole read.
  EtcdJoin join = Join("new:1", kNodes);
  const uint64_t before = join.keys_read();
  absl::StatusOr<EtcdJoin::Claimed> c = join.Claim(Me("n"), lease, absl::Now() + kTimeout);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(ranks.contains(c->rank));
  EXPECT_LE(join.keys_read() - before, 4u * EtcdJoin::kWindow);
  // A restarted address finds its rank through the address index: one rank read.
  EtcdJoin again = Join("h:7", kNodes);
  absl::StatusOr<EtcdJoin::Claimed> back = again.Claim(Me("n2"), lease, absl::Now() + kTimeout);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(ranks.contains(back->rank));
  EXPECT_LE(again.keys_read(), 2u);
}

TEST_F(EtcdJoinTest, RanksNeverHeldGoFirstThenRanksWhoseNodeIsGone) {
  // Two ranks: both taken, one holder leaves for good (its lease revoked).
  const int64_t gone_lease = Lease();
  absl::StatusOr<EtcdJoin::Claimed> a = Claim("a:1", 2, gone_lease);
  absl::StatusOr<EtcdJoin::Claimed> b = Claim("b:1", 2, Lease());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(etcd_->LeaseRevoke(gone_lease, kTimeout).ok());
  // A new address gets the gone rank (every rank was held once), with news
  // naming the instance it replaces.
  absl::StatusOr<EtcdJoin::Claimed> c = Claim("c:1", 2, Lease(), -1, "ic");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank, a->rank);
  std::optional<v1::ClusterNode> news = News(c->rank);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->address(), "c:1");
  EXPECT_EQ(news->previous_instance(), "i");
  // a:1 comes back: its rank is c's now, and the other is live: full.
  EXPECT_EQ(Claim("a:1", 2, Lease()).status().code(), absl::StatusCode::kResourceExhausted);
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
  absl::StatusOr<int64_t> change = etcd_->Put(prefix_ + "n/00003", "x", 0, kTimeout);
  ASSERT_TRUE(change.ok()) << change.status();
  const int64_t epoch = join.AdvanceEpochPast(*change);
  EXPECT_EQ(epoch, 1);
  EXPECT_EQ(join.AdvanceEpochPast(*change), 1);  // already past it: no second step
  change = etcd_->Put(prefix_ + "n/00002", "y", 0, kTimeout);
  ASSERT_TRUE(change.ok());
  EXPECT_EQ(join.AdvanceEpochPast(*change), 2);
}

}  // namespace
}  // namespace hsdp::etcd
