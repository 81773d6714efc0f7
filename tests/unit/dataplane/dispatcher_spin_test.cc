// The dispatcher publishes how clients' spinning waits share a CPU
// (data_plane.spin_mode) in every session's channel, for sessions attached
// before and after it started; a channel holding another value (a stale or
// scribbled one) is overwritten.
#include <algorithm>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "gtest/gtest.h"
#include "hsdp/shm/layout.h"
#include "common/wait.h"

namespace hsdp {
namespace {

const PeerCred kCred{1, 1000, 1000};

TEST(ParseSpinMode, NamesMapToTheSharedModes) {
  EXPECT_EQ(ParseSpinMode("yield"), shm::kSpinYield);
  EXPECT_EQ(ParseSpinMode("pause"), shm::kSpinPause);
}

class DispatcherSpinTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  static NodeConfig Config() {
    NodeConfig c;
    c.ring_entries = 16;
    return c;
  }
  static NodeLimits Limits() {
    NodeLimits l;
    l.max_node_bytes = 1 << 30;
    l.max_mappings = 1000;
    return l;
  }

  static shm::ChannelHeader* Header(Session& s) {
    return static_cast<shm::ChannelHeader*>(s.channel().region().data());
  }
  // Waits (bounded) until the session's channel shows `want`; what it shows.
  static uint32_t AwaitMode(Session& s, uint32_t want) {
    return hsdp::testing::EventuallyEq([&] { return Header(s)->spin_mode.load(); }, want, 10000, 1);
  }

  FakeStreamEngine engine_;
};

TEST_P(DispatcherSpinTest, EverySessionSeesTheModeAndNewSessionsToo) {
  SessionManager sm(Config(), Limits(), &engine_);
  absl::StatusOr<std::unique_ptr<WakeFd>> wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok()) << wake.status();
  Dispatcher dispatcher(&sm, wake->get(), 0, nullptr, GetParam());
  auto attach = [&](int rank) {
    AttachParams p;
    p.job_id = "spin";
    p.rank = rank;
    p.world_size = 2;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented;
    auto a = sm.Attach(p, kCred);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(sm.ClaimSession(a->session_id, a->token.data(), kCred).ok());
    return sm.FindSession(a->session_id);
  };
  const uint32_t want = GetParam();
  const uint32_t other = want == shm::kSpinPause ? shm::kSpinYield : shm::kSpinPause;
  std::shared_ptr<Session> first = attach(0);
  ASSERT_NE(first, nullptr);
  Header(*first)->spin_mode.store(other);
  dispatcher.Start();
  EXPECT_EQ(AwaitMode(*first, want), want);
  // A session attached later gets it too (for kSpinYield, 0, a fresh
  // channel's value: only the first session's overwrite tests that mode).
  std::shared_ptr<Session> second = attach(1);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(AwaitMode(*second, want), want);
  dispatcher.Stop();
}

INSTANTIATE_TEST_SUITE_P(Settings, DispatcherSpinTest,
                         ::testing::Values(shm::kSpinPause, shm::kSpinYield));

// A drain ends every session the moment the last operation completed; a
// descriptor the dispatcher pops from such a session afterwards (its group
// already gone) fails as not started (UNAVAILABLE: the client submits it
// again after reconnecting), not as "unknown group" (INVALID_ARGUMENT: the
// client gave up, and its peer, which retried, was left out of step).
TEST(DispatcherEndingSessionTest, AnOperationQueuedInAnEndingSessionFailsAsNotStarted) {
  NodeConfig config;
  config.ring_entries = 16;
  NodeLimits limits;
  limits.max_node_bytes = 1 << 30;
  limits.max_mappings = 1000;
  FakeStreamEngine engine;
  SessionManager sm(config, limits, &engine);
  absl::StatusOr<std::unique_ptr<WakeFd>> wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok()) << wake.status();
  Dispatcher dispatcher(&sm, wake->get(), 0);
  AttachParams p;
  p.job_id = "drained";
  p.world_size = 1;
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented;
  auto a = sm.Attach(p, kCred);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(sm.ClaimSession(a->session_id, a->token.data(), kCred).ok());
  auto g = sm.NewGroup(a->session_id, {0}, kCred);
  ASSERT_TRUE(g.ok()) << g.status();
  std::shared_ptr<Session> s = sm.FindSession(a->session_id);  // the dispatcher's snapshot
  ASSERT_NE(s, nullptr);
  sm.EndAll("hsdpd drained for a restart");
  shm::OpDescriptor d{};
  d.op_id = 7;
  d.group_id = g->group_id;
  d.epoch = g->epoch;
  d.collective = static_cast<uint8_t>(Collective::kBarrier);
  dispatcher.Handle(s, d);
  shm::Completion& c =
      shm::CompletionSlots(static_cast<shm::ChannelHeader*>(s->channel().region().data()))[7 % 16];
  ASSERT_EQ(c.op_id.load(), 7u);
  EXPECT_EQ(c.code, static_cast<int32_t>(absl::StatusCode::kUnavailable))
      << std::string(c.message, std::min<size_t>(c.message_len, sizeof(c.message)));
}

}  // namespace
}  // namespace hsdp
