// The etcd membership's sweeper (daemon/cluster/etcd/etcd_sweeper.h) and the
// member's sparse view and campaigns (etcd_member.h) against a real etcd on
// loopback (etcd_test_cluster.h): a loss becomes news once; a rank taken
// again is never published lost; a new sweeper publishes what nobody
// published; members hear of no first join, hear a loss, and elect a new
// sweeper when the old one dies.
#include "daemon/cluster/etcd/etcd_sweeper.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_join.h"
#include "daemon/cluster/etcd/etcd_member.h"
#include "daemon/cluster/etcd/etcd_store.h"
#include "etcd_test_cluster.h"
#include "gtest/gtest.h"

namespace hsdp::etcd {
namespace {

using ::hsdp::testing::Eventually;
using ::hsdp::testing::EtcdTestCluster;

constexpr absl::Duration kTimeout = absl::Seconds(10);

class EtcdSweeperTest : public ::testing::Test {
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
    etcd_ = Connect();
    ASSERT_NE(etcd_, nullptr);
    prefix_ = absl::StrCat("/", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           "/");
  }
  void TearDown() override {
    if (sweeper_ != nullptr) sweeper_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  static std::unique_ptr<EtcdClient> Connect() {
    EtcdOptions options;
    options.endpoints = cluster_->endpoints();
    auto client = EtcdClient::Connect(options, kTimeout);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  EtcdJoin Join(const std::string& address) {
    return EtcdJoin(etcd_.get(), {.prefix = prefix_, .address = address, .nodes = kNodes});
  }
  int64_t Lease() {
    absl::StatusOr<int64_t> lease = etcd_->LeaseGrant(absl::Seconds(30), kTimeout);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.value_or(0);
  }
  int Claim(const std::string& address, int64_t lease, const std::string& instance) {
    v1::ClusterNode me;
    me.set_instance(instance);
    absl::StatusOr<EtcdJoin::Claimed> c = Join(address).Claim(me, lease, absl::Now() + kTimeout);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->rank : -1;
  }
  std::optional<v1::ClusterNode> News(int rank) {
    absl::StatusOr<RangeResult> r = etcd_->Range(EtcdKeys(prefix_).NewsOf(rank), "", kTimeout);
    EXPECT_TRUE(r.ok()) << r.status();
    v1::ClusterNode n;
    if (!r.ok() || r->kvs.empty() || !n.ParseFromString(r->kvs[0].value)) return std::nullopt;
    return n;
  }
  int64_t Epoch() {
    absl::StatusOr<RangeResult> r = etcd_->Range(EtcdKeys(prefix_).Epoch(), "", kTimeout);
    int64_t epoch = 0;
    if (r.ok() && !r->kvs.empty()) (void)absl::SimpleAtoi(r->kvs[0].value, &epoch);
    return epoch;
  }
  void StartSweeper() {
    join_ = std::make_unique<EtcdJoin>(
        etcd_.get(), EtcdJoin::Options{.prefix = prefix_, .address = "sweeper:1", .nodes = kNodes});
    sweeper_ = std::make_unique<EtcdSweeper>(etcd_.get(), join_.get(), prefix_, kNodes);
    thread_ = std::thread([s = sweeper_.get()] { s->Run(); });
  }
  void StopSweeper() {
    sweeper_->Stop();
    thread_.join();
    sweeper_.reset();
  }

  static constexpr uint32_t kNodes = 8;
  static EtcdTestCluster* cluster_;
  static absl::Status* start_status_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string prefix_;
  std::unique_ptr<EtcdJoin> join_;
  std::unique_ptr<EtcdSweeper> sweeper_;
  std::thread thread_;
};
EtcdTestCluster* EtcdSweeperTest::cluster_ = nullptr;
absl::Status* EtcdSweeperTest::start_status_ = nullptr;

TEST_F(EtcdSweeperTest, AGoneNodeKeyBecomesLostNewsOnceWithANewEpoch) {
  const int64_t la = Lease();
  const int a = Claim("a:1", la, "ia");
  const int b = Claim("b:1", Lease(), "ib");
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  StartSweeper();
  ASSERT_TRUE(Eventually([&] { return sweeper_->tracked() == 2; }, 10000));
  EXPECT_EQ(sweeper_->published(), 0u);
  const int64_t epoch = Epoch();
  ASSERT_TRUE(etcd_->LeaseRevoke(la, kTimeout).ok());  // a's key goes
  ASSERT_TRUE(Eventually([&] { return sweeper_->published() == 1; }, 10000));
  std::optional<v1::ClusterNode> news = News(a);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->state(), "lost");
  EXPECT_EQ(news->instance(), "ia");
  EXPECT_EQ(news->address(), "a:1");
  EXPECT_GT(news->changed_epoch(), static_cast<uint64_t>(epoch));
  EXPECT_GT(Epoch(), epoch);
  EXPECT_FALSE(News(b).has_value());
  EXPECT_EQ(sweeper_->tracked(), 1u);
}

TEST_F(EtcdSweeperTest, ANewSweeperPublishesWhatNobodyPublishedButNotARankTakenAgain) {
  // No sweeper while: a leaves for good, b leaves and comes back (a new
  // instance on its rank, with news naming the old one), c stays.
  const int64_t la = Lease(), lb = Lease();
  const int a = Claim("a:1", la, "ia");
  const int b = Claim("b:1", lb, "ib");
  const int c = Claim("c:1", Lease(), "ic");
  ASSERT_TRUE(a >= 0 && b >= 0 && c >= 0);
  ASSERT_TRUE(etcd_->LeaseRevoke(la, kTimeout).ok());
  ASSERT_TRUE(etcd_->LeaseRevoke(lb, kTimeout).ok());
  ASSERT_EQ(Claim("b:1", Lease(), "ib2"), b);

  StartSweeper();
  ASSERT_TRUE(Eventually([&] { return sweeper_->tracked() == 2; }, 10000));  // b and c
  EXPECT_EQ(sweeper_->published(), 1u);
  std::optional<v1::ClusterNode> news = News(a);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->state(), "lost");
  EXPECT_EQ(news->instance(), "ia");
  news = News(b);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(news->state(), "alive");  // not overwritten with b's old instance lost
  EXPECT_EQ(news->instance(), "ib2");
  EXPECT_EQ(news->previous_instance(), "ib");
  EXPECT_FALSE(News(c).has_value());

  // The next sweeper finds nothing left to publish.
  StopSweeper();
  StartSweeper();
  ASSERT_TRUE(Eventually([&] { return sweeper_->tracked() == 2; }, 10000));
  EXPECT_EQ(sweeper_->published(), 0u);
}

// Members: real EtcdMembers, each with its own client, as daemons have.
class Member {
 public:
  Member(const std::string& prefix, const std::string& address,
         const std::vector<std::string>& endpoints)
      : client_(Connect(endpoints)),
        store_(client_.get(), prefix),
        member_(client_.get(), &store_,
                {.prefix = prefix,
                 .address = address,
                 .data_address = "127.0.0.1",
                 .name = address,
                 .nodes = 3,
                 .join_timeout = kTimeout,
                 .heartbeat = absl::Milliseconds(250),
                 .missed_heartbeats = 4,  // a 1 s lease
                 .revoke_on_stop = false},
                [this](const PeerEvent& e) {
                  absl::MutexLock l(&mu_);
                  events_.push_back(e);
                }) {}
  EtcdMember& m() { return member_; }
  bool LostEvent(int rank) {
    absl::MutexLock l(&mu_);
    for (const PeerEvent& e : events_) {
      if (e.kind == PeerEvent::Kind::kLost && e.node == rank) return true;
    }
    return false;
  }
  size_t events() {
    absl::MutexLock l(&mu_);
    return events_.size();
  }
 private:
  static std::unique_ptr<EtcdClient> Connect(const std::vector<std::string>& endpoints) {
    EtcdOptions options;
    options.endpoints = endpoints;
    auto client = EtcdClient::Connect(options, kTimeout);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::unique_ptr<EtcdClient> client_;
  EtcdStore store_;
  absl::Mutex mu_;
  std::vector<PeerEvent> events_ ABSL_GUARDED_BY(mu_);
  EtcdMember member_;
};

std::string StateOf(const v1::NodesResponse& view, int rank) {
  for (const auto& n : view.nodes()) {
    if (n.node_rank() == rank) return n.state();
  }
  return "";
}

class EtcdMemberSparseTest : public EtcdSweeperTest {};

TEST_F(EtcdMemberSparseTest, FirstJoinsAreNoNewsALossIsAndASweeperIsElectedAgain) {
  auto m0 = std::make_unique<Member>(prefix_, "m0:1", cluster_->endpoints());
  auto m1 = std::make_unique<Member>(prefix_, "m1:1", cluster_->endpoints());
  ASSERT_TRUE(m0->m().Start().ok());
  ASSERT_TRUE(m1->m().Start().ok());
  // One of them is elected (ranks 0-7 campaign at once).
  ASSERT_TRUE(Eventually([&] { return m0->m().sweeping() || m1->m().sweeping(); }, 10000));
  EXPECT_FALSE(m0->m().sweeping() && m1->m().sweeping());
  // Sparse views: neither heard of the other's first join; `hsdpctl nodes`
  // (ClusterView) shows both alive from etcd.
  const int r0 = m0->m().node_rank(), r1 = m1->m().node_rank();
  EXPECT_EQ(StateOf(m1->m().View(), r0), "");
  EXPECT_EQ(m1->events(), 0u);
  EXPECT_EQ(StateOf(m1->m().ClusterView(), r0), "alive");
  EXPECT_EQ(StateOf(m0->m().ClusterView(), r1), "alive");

  // The sweeper crashes (its lease runs out: Stop without revoking). The
  // other is elected and publishes the loss: it hears it, as a loss of a
  // rank it never heard of.
  const bool first_sweeps = m0->m().sweeping();
  std::unique_ptr<Member>& gone = first_sweeps ? m0 : m1;
  std::unique_ptr<Member>& survivor = first_sweeps ? m1 : m0;
  const int gone_rank = gone->m().node_rank();
  const uint64_t epoch = survivor->m().epoch();
  gone->m().Stop();
  gone.reset();
  ASSERT_TRUE(Eventually([&] { return survivor->m().sweeping(); }, 15000));
  ASSERT_TRUE(Eventually([&] { return survivor->LostEvent(gone_rank); }, 10000));
  EXPECT_EQ(StateOf(survivor->m().View(), gone_rank), "lost");
  EXPECT_GT(survivor->m().epoch(), epoch);
  EXPECT_EQ(survivor->m().losses_published(), 1u);
}

}  // namespace
}  // namespace hsdp::etcd
