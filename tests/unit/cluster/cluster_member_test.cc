// ClusterMember against an in-process coordinator on a loopback port: join,
// the sparse view (no event for a first join, the whole list from the
// coordinator), PeerEvents for a lost, a rejoining and a restarted node, the coordinator's death seen
// as "degraded", a wrong token failing fast, the join timeout, Stop ending a
// join, group events relayed to the other members; and KvClusterDirectory
// (placement, its conflicts, resolution with a deadline, withdrawal, the
// epoch a re-created group starts in) over the same coordinator.
#include "daemon/cluster/cluster_member.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/wait.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "daemon/cluster/token_authenticator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "common/wait.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kHeartbeatMs = 50;
constexpr uint32_t kMissed = 3;

// Coordinator + KV + service on 127.0.0.1:<ephemeral>.
class InProcessCoordinator {
 public:
  explicit InProcessCoordinator(uint32_t nodes) : auth_("tok") {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    coordinator_ = std::make_unique<Coordinator>(Coordinator::Options{
        .self_address = "", .nodes = nodes, .heartbeat_ms = kHeartbeatMs,
        .missed_heartbeats = kMissed});
    service_ = std::make_unique<ClusterServiceImpl>(&auth_, coordinator_.get(), &kv_, "");
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    coordinator_->Start();
  }
  ~InProcessCoordinator() { Stop(); }
  void Stop() {
    if (server_ == nullptr) return;
    coordinator_->Stop();
    kv_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  TokenAuthenticator auth_;
  KvStore kv_;
  int port_ = 0;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ClusterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
};

class Events {
 public:
  PeerEvents Callback() {
    return [this](const PeerEvent& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(e);
    };
  }
  // Waits up to `ms` for an event of `kind` about `node`.
  bool Saw(PeerEvent::Kind kind, int node, int ms) {
    absl::MutexLock l(&mu_);
    auto seen = [&] {
      for (const PeerEvent& e : events_) {
        if (e.kind == kind && e.node == node) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Milliseconds(ms));
  }
  // Events about `node` so far.
  int CountAbout(int node) {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const PeerEvent& e : events_) n += e.node == node;
    return n;
  }

 private:
  absl::Mutex mu_;
  std::vector<PeerEvent> events_;
};

ClusterMember::Options Member(const std::string& coordinator, const std::string& address,
                              uint32_t nodes, const std::string& token = "tok") {
  return {.coordinator = coordinator, .address = address, .data_address = "127.0.0.1",
          .name = address, .nodes = nodes, .node_rank = -1, .token = token,
          .is_coordinator = false, .join_timeout = absl::Seconds(5),
          .heartbeat = absl::Milliseconds(kHeartbeatMs), .missed_heartbeats = kMissed};
}

// A member's view is sparse: a node's first join is no event (no group can
// span it yet) and the member does not hold it, but `hsdpctl nodes`
// (ClusterView) lists it; its loss, its restart and its return are events.
TEST(ClusterMemberTest, LostAndRejoinedPeersBecomeEvents) {
  InProcessCoordinator coordinator(4);
  Events events;
  ClusterMember a(Member(coordinator.address(), "a:1", 4), events.Callback());
  ASSERT_TRUE(a.Start().ok());
  auto b = std::make_unique<ClusterMember>(Member(coordinator.address(), "b:1", 4), nullptr);
  ASSERT_TRUE(b->Start().ok());
  const int b_rank = b->node_rank();
  const uint64_t epoch = b->epoch();
  // a's epoch passes b's join (published in a later step) without an event.
  ASSERT_TRUE(hsdp::testing::Eventually([&] { return a.epoch() > epoch; }, 5000));
  EXPECT_EQ(events.CountAbout(b_rank), 0);
  EXPECT_EQ(a.View().nodes_size(), 1);  // itself
  v1::NodesResponse whole = a.ClusterView();
  EXPECT_EQ(whole.state(), "ok");
  ASSERT_EQ(whole.nodes_size(), 2);
  auto find = [&](int rank) -> const v1::NodeStatus* {
    for (const v1::NodeStatus& n : whole.nodes()) {
      if (n.node_rank() == rank) return &n;
    }
    return nullptr;
  };
  ASSERT_NE(find(b_rank), nullptr);
  EXPECT_EQ(find(b_rank)->state(), "alive");
  EXPECT_EQ(find(b_rank)->address(), "b:1");
  ASSERT_NE(find(a.node_rank()), nullptr);
  EXPECT_TRUE(find(a.node_rank())->self());

  b.reset();  // stops heartbeating
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kLost, b_rank, kHeartbeatMs * kMissed + 2000));
  EXPECT_GT(a.epoch(), epoch);
  v1::NodesResponse view = a.View();
  EXPECT_EQ(view.state(), "ok");
  ASSERT_EQ(view.nodes_size(), 2);  // itself and the lost node it heard of

  // The node comes back (a new instance, same address): same rank, joined.
  ClusterMember b2(Member(coordinator.address(), "b:1", 4), nullptr);
  ASSERT_TRUE(b2.Start().ok());
  EXPECT_EQ(b2.node_rank(), b_rank);
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kJoined, b_rank, 5000));

  // A node a never heard of restarts: a hears that its daemon ended (a
  // restart, or a loss and a rejoin when the coordinator saw the silence
  // first) and that it is back.
  auto c = std::make_unique<ClusterMember>(Member(coordinator.address(), "c:1", 4), nullptr);
  ASSERT_TRUE(c->Start().ok());
  const int c_rank = c->node_rank();
  c.reset();
  ClusterMember c2(Member(coordinator.address(), "c:1", 4), nullptr);
  ASSERT_TRUE(c2.Start().ok());
  ASSERT_EQ(c2.node_rank(), c_rank);
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kLost, c_rank, 5000));
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kJoined, c_rank, 5000));
}

TEST(ClusterMemberTest, DeadCoordinatorMeansDegraded) {
  auto coordinator = std::make_unique<InProcessCoordinator>(2);
  ClusterMember a(Member(coordinator->address(), "a:1", 2), nullptr);
  ASSERT_TRUE(a.Start().ok());
  EXPECT_EQ(a.View().state(), "ok");
  const std::string address = coordinator->address();
  coordinator.reset();
  EXPECT_EQ(hsdp::testing::EventuallyEq([&] { return a.View().state(); }, std::string("degraded"),
                                         5000, 10),
            "degraded");
  const v1::NodesResponse view = a.View();
  EXPECT_EQ(view.state(), "degraded");
  EXPECT_THAT(view.detail(), HasSubstr(address));
}

TEST(ClusterMemberTest, WrongTokenFailsFast) {
  InProcessCoordinator coordinator(2);
  ClusterMember a(Member(coordinator.address(), "a:1", 2, "wrong"), nullptr);
  const absl::Time start = absl::Now();
  const absl::Status s = a.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("wrong cluster token"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(a.View().state(), "failed");
}

TEST(ClusterMemberTest, JoinTimesOutWhenNobodyAnswers) {
  ClusterMember::Options o = Member("127.0.0.1:1", "a:1", 2);
  o.join_timeout = absl::Milliseconds(300);
  ClusterMember a(o, nullptr);
  const absl::Time start = absl::Now();
  const absl::Status s = a.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("join_timeout_ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}


class GroupEventLog {
 public:
  GroupEvents Callback() {
    return [this](const v1::GroupEvent& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(e);
    };
  }
  bool Saw(const std::string& key, int ms) {
    absl::MutexLock l(&mu_);
    auto seen = [&] {
      for (const v1::GroupEvent& e : events_) {
        if (e.group_key() == key) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Milliseconds(ms));
  }
  std::vector<v1::GroupEvent> events() {
    absl::MutexLock l(&mu_);
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::GroupEvent> events_;
};

TEST(ClusterMemberTest, GroupEventsReachTheOtherMembersOnly) {
  InProcessCoordinator coordinator(4);  // rank 0 stays free for a coordinator
  GroupEventLog at_a, at_b;
  ClusterMember a(Member(coordinator.address(), "a:1", 4), nullptr, at_a.Callback());
  ClusterMember b(Member(coordinator.address(), "b:1", 4), nullptr, at_b.Callback());
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  v1::GroupEvent e;
  e.set_group_key("key-1");
  e.set_epoch(3);
  e.set_why("rank 5 left the job");
  a.ReportGroupEvent(e);
  ASSERT_TRUE(at_b.Saw("key-1", 3000));
  const v1::GroupEvent got = at_b.events().front();
  EXPECT_EQ(got.epoch(), 3u);
  EXPECT_EQ(got.origin_node(), a.node_rank());
  EXPECT_EQ(got.why(), "rank 5 left the job");
  // A member that joins afterwards does not replay it; the origin never sees its own.
  GroupEventLog at_c;
  ClusterMember c(Member(coordinator.address(), "c:1", 4), nullptr, at_c.Callback());
  ASSERT_TRUE(c.Start().ok());
  e.set_group_key("key-2");
  b.ReportGroupEvent(e);
  ASSERT_TRUE(at_c.Saw("key-2", 3000));
  EXPECT_EQ(at_c.events().size(), 1u);
  ASSERT_TRUE(at_a.Saw("key-2", 3000));
  for (const v1::GroupEvent& seen : at_a.events()) EXPECT_NE(seen.group_key(), "key-1");
}

TEST(ClusterMemberTest, StopEndsAJoinInProgress) {
  // Nothing listens there: the join would retry for 30 s.
  ClusterMember::Options o = Member("127.0.0.1:1", "a:1", 2);
  o.join_timeout = absl::Seconds(30);
  ClusterMember a(o, nullptr);
  absl::Status status;
  absl::Notification done;
  std::thread t([&] {
    status = a.Start();
    done.Notify();
  });
  // Stop comes while a join attempt is under way, not before the first one.
  EXPECT_TRUE(::hsdp::testing::Eventually([&] { return a.rpcs() >= 1; }, 5000));
  const absl::Time stop = absl::Now();
  a.Stop();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
}

TEST(KvClusterDirectoryTest, PlacementConflictsResolutionAndWithdrawal) {
  InProcessCoordinator coordinator(3);
  ClusterMember a(Member(coordinator.address(), "a:1", 3), nullptr);
  ClusterMember b(Member(coordinator.address(), "b:1", 3), nullptr);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  ClusterClient ca(coordinator.address(), "tok"), cb(coordinator.address(), "tok");
  KvClusterDirectory da(&ca, &a, 3), db(&cb, &b, 3);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  // A job id with separators cannot collide with another job's keys.
  const JobKey job{1000, "team/a:1"};
  ASSERT_TRUE(da.Publish(job, 0, 4, soon, false).ok());
  ASSERT_TRUE(da.Publish(job, 3, 4, soon, false).ok());
  ASSERT_TRUE(db.Publish(job, 1, 4, soon, false).ok());
  absl::Status twice = db.Publish(job, 0, 4, soon, false);
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(twice.message(), HasSubstr("node " + std::to_string(a.node_rank())));
  absl::Status world = db.Publish(job, 2, 8, soon, false);
  EXPECT_EQ(world.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(world.message(), HasSubstr("world size 4"));
  // Rank 2 is not placed yet: resolution waits for it, up to its deadline.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<int>> missing =
      da.Resolve(job, {3, 1, 2, 0}, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("rank(s) 2 "));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  std::thread late([&] { EXPECT_TRUE(db.Publish(job, 2, 4, soon, false).ok()); });
  absl::StatusOr<std::vector<int>> nodes = da.Resolve(job, {3, 1, 2, 0}, soon);
  late.join();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(*nodes, (std::vector<int>{a.node_rank(), b.node_rank(), b.node_rank(), a.node_rank()}));
  // Rank 1 leaves node b and attaches on node a.
  db.Withdraw(job, {1}, soon);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  absl::Status moved;
  do {
    moved = da.Publish(job, 1, 4, soon, false);
  } while (!moved.ok() && absl::Now() < until);
  EXPECT_TRUE(moved.ok()) << moved;
  // Everyone leaves: the job id (and its world size) is free again.
  da.Withdraw(job, {0, 1, 3}, soon);
  db.Withdraw(job, {2}, soon);
  absl::Status reused;
  do {
    reused = da.Publish(job, 0, 2, soon, false);
  } while (!reused.ok() && absl::Now() < until);
  EXPECT_TRUE(reused.ok()) << reused;
}

// A job's cluster-wide key is its owner plus its name: two uids' jobs of the
// same name are placed independently (neither blocks or resolves into the
// other), and root joining another uid's job (join_only) finds only a job
// that has ranks placed somewhere.
TEST(KvClusterDirectoryTest, PlacementIsPerOwnerAndJoinOnlyNeedsAPlacedJob) {
  InProcessCoordinator coordinator(3);
  ClusterMember a(Member(coordinator.address(), "a:1", 3), nullptr);
  ClusterMember b(Member(coordinator.address(), "b:1", 3), nullptr);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  ClusterClient ca(coordinator.address(), "tok"), cb(coordinator.address(), "tok");
  KvClusterDirectory da(&ca, &a, 3), db(&cb, &b, 3);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  const JobKey alice{60001, "train"}, mallory{60002, "train"};
  // Mallory places rank 0 of her "train" (world 8) first, on node b.
  ASSERT_TRUE(db.Publish(mallory, 0, 8, soon, false).ok());
  // Alice's "train" (world 2) is another job: same rank, other world size, fine.
  ASSERT_TRUE(da.Publish(alice, 0, 2, soon, false).ok());
  ASSERT_TRUE(da.Publish(alice, 1, 2, soon, false).ok());
  absl::StatusOr<std::vector<int>> nodes = db.Resolve(alice, {0, 1}, soon);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(*nodes, (std::vector<int>{a.node_rank(), a.node_rank()}));
  absl::StatusOr<std::vector<int>> hers = da.Resolve(mallory, {0}, soon);
  ASSERT_TRUE(hers.ok()) << hers.status();
  EXPECT_EQ(*hers, (std::vector<int>{b.node_rank()}));
  // Mallory's rank 1 was never placed, even though Alice's was.
  EXPECT_EQ(da.Resolve(mallory, {1}, absl::Now() + absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // join_only: a placed job may be joined (rank 1 of Mallory's job, from node a) ...
  EXPECT_TRUE(da.Publish(mallory, 1, 8, soon, true).ok());
  // ... a job nobody placed under that owner may not, even if the name exists
  // under another uid.
  absl::Status none = db.Publish(JobKey{60003, "train"}, 0, 2, soon, true);
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_THAT(none.message(), HasSubstr("uid 60003 has no job \"train\""));
  EXPECT_EQ(db.Resolve(JobKey{60003, "train"}, {0}, absl::Now() + absl::Milliseconds(200))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded)
      << "the refused join placed nothing";
}

TEST(KvClusterDirectoryTest, AReportedFailureMovesTheFirstEpochOfTheGroup) {
  InProcessCoordinator coordinator(2);
  ClusterMember a(Member(coordinator.address(), "a:1", 2), nullptr);
  ASSERT_TRUE(a.Start().ok());
  ClusterClient ca(coordinator.address(), "tok");
  KvClusterDirectory da(&ca, &a, 2);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  EXPECT_EQ(*da.FirstEpoch("g", soon), 1u);
  da.ReportEpochFailed("g", 3, 0, "rank 1 left");
  EXPECT_EQ(hsdp::testing::EventuallyEq([&] { return *da.FirstEpoch("g", soon); }, 4u, 5000), 4u);
  da.ReportEpochFailed("g", 2, 0, "older news");  // never moves it back
  // A fence: the member sends its reports in order, so once this later one
  // (another group) took effect, the older news about "g" has been handled.
  da.ReportEpochFailed("fence", 1, 0, "fence");
  ASSERT_EQ(hsdp::testing::EventuallyEq([&] { return *da.FirstEpoch("fence", soon); }, 2u, 5000),
            2u);
  EXPECT_EQ(*da.FirstEpoch("g", soon), 4u);
}

}  // namespace
}  // namespace hsdp
