// ClusterMember against an in-process coordinator on a loopback port: join,
// PeerEvents for a lost and a rejoining node, the coordinator's death seen
// as "degraded", a wrong token failing fast, and the join timeout.
#include "daemon/cluster/cluster_member.h"

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/token_authenticator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

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

TEST(ClusterMemberTest, LostAndRejoinedPeersBecomeEvents) {
  InProcessCoordinator coordinator(3);
  Events events;
  ClusterMember a(Member(coordinator.address(), "a:1", 3), events.Callback());
  ASSERT_TRUE(a.Start().ok());
  auto b = std::make_unique<ClusterMember>(Member(coordinator.address(), "b:1", 3), nullptr);
  ASSERT_TRUE(b->Start().ok());
  const int b_rank = b->node_rank();
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kJoined, b_rank, 2000));
  const uint64_t epoch = b->epoch();

  b.reset();  // stops heartbeating
  EXPECT_TRUE(events.Saw(PeerEvent::Kind::kLost, b_rank, kHeartbeatMs * kMissed + 2000));
  EXPECT_GT(a.epoch(), epoch);
  v1::NodesResponse view = a.View();
  EXPECT_EQ(view.state(), "ok");
  ASSERT_EQ(view.nodes_size(), 2);

  // The node comes back (a new instance, same address): same rank.
  ClusterMember b2(Member(coordinator.address(), "b:1", 3), nullptr);
  ASSERT_TRUE(b2.Start().ok());
  EXPECT_EQ(b2.node_rank(), b_rank);
}

TEST(ClusterMemberTest, DeadCoordinatorMeansDegraded) {
  auto coordinator = std::make_unique<InProcessCoordinator>(2);
  ClusterMember a(Member(coordinator->address(), "a:1", 2), nullptr);
  ASSERT_TRUE(a.Start().ok());
  EXPECT_EQ(a.View().state(), "ok");
  const std::string address = coordinator->address();
  coordinator.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (a.View().state() != "degraded" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
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

}  // namespace
}  // namespace hsdp
