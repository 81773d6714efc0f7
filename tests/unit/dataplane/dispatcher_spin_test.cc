// The dispatcher publishes how clients' spinning waits share a CPU
// (data_plane.spin_mode) in every session's channel, and the rule "auto"
// follows: yield only while the spinners outnumber the CPUs.
#include <memory>

#include "absl/time/clock.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/session/shm_channel.h"
#include "gtest/gtest.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

const PeerCred kCred{1, 1000, 1000};

TEST(ChooseSpinMode, AutoYieldsOnlyWhenSpinnersOutnumberCpus) {
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kAuto, 2, 2), shm::kSpinDefault);
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kAuto, 3, 2), shm::kSpinYield);
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kAuto, 9, 64), shm::kSpinDefault);
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kAuto, 2, 0), shm::kSpinYield);  // unknown: one CPU
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kPause, 100, 1), shm::kSpinPause);
  EXPECT_EQ(ChooseSpinMode(SpinSetting::kYield, 1, 64), shm::kSpinYield);
  EXPECT_EQ(ParseSpinSetting("yield"), SpinSetting::kYield);
  EXPECT_EQ(ParseSpinSetting("pause"), SpinSetting::kPause);
  EXPECT_EQ(ParseSpinSetting("auto"), SpinSetting::kAuto);
}

class DispatcherSpinTest : public ::testing::TestWithParam<SpinSetting> {
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

  // The spin mode session `id`'s channel shows, once it is not 0 (bounded).
  static uint32_t PublishedMode(Session& s) {
    const auto* h = static_cast<const shm::ChannelHeader*>(s.channel().region().data());
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (h->spin_mode.load() == shm::kSpinDefault && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return h->spin_mode.load();
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
  std::shared_ptr<Session> first = attach(0);
  ASSERT_NE(first, nullptr);
  dispatcher.Start();
  const uint32_t want = GetParam() == SpinSetting::kYield ? shm::kSpinYield : shm::kSpinPause;
  EXPECT_EQ(PublishedMode(*first), want);
  std::shared_ptr<Session> second = attach(1);  // after the dispatcher started
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(PublishedMode(*second), want);
  dispatcher.Stop();
}

INSTANTIATE_TEST_SUITE_P(Settings, DispatcherSpinTest,
                         ::testing::Values(SpinSetting::kPause, SpinSetting::kYield));

}  // namespace
}  // namespace hsdp
