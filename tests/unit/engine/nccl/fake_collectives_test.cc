// The fake NCCL itself: it must be as strict as real NCCL where the engine
// could get it wrong (group calls, duplicate GPUs, aborted communicators).
#include "daemon/engine/nccl/fake_collectives.h"

#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

class FakeCollectivesTest : public ::testing::Test {
 protected:
  FakeCollectivesTest() : dev_(2), coll_(&dev_) {}
  std::vector<CommHandle> Init(int nranks, std::vector<int> ranks, std::vector<int> devices) {
    auto id = coll_.NewUniqueId();
    EXPECT_TRUE(id.ok());
    auto comms = coll_.InitRanks(*id, nranks, ranks, devices);
    EXPECT_TRUE(comms.ok()) << comms.status();
    return comms.ok() ? *comms : std::vector<CommHandle>{};
  }
  device::FakeDeviceApi dev_;
  FakeCollectives coll_;
};

TEST_F(FakeCollectivesTest, InitIsNonBlockingAndRefusesDuplicateGpus) {
  auto id = coll_.NewUniqueId();
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(coll_.InitRanks(*id, 2, {0, 1}, {0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto comms = Init(2, {0, 1}, {0, 1});
  ASSERT_EQ(comms.size(), 2u);
  absl::Status err;
  EXPECT_EQ(coll_.Query(comms[0], &err), AsyncState::kInProgress);
  EXPECT_EQ(coll_.Query(comms[0], &err), AsyncState::kReady);
}

TEST_F(FakeCollectivesTest, SeveralLocalRanksOutsideAGroupAreRefused) {
  auto comms = Init(2, {0, 1}, {0, 1});
  auto s0 = dev_.CreateStream(0, device::StreamPriority::kDefault);
  auto buf = dev_.Allocate(0, 64);
  auto st = coll_.AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp{}, comms[0], *s0);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("deadlock"), std::string::npos);
}

TEST_F(FakeCollectivesTest, StreamMustBeOnTheCommunicatorsDevice) {
  auto comms = Init(2, {0, 1}, {0, 1});
  auto s1 = dev_.CreateStream(1, device::StreamPriority::kDefault);
  auto buf = dev_.Allocate(0, 64);
  ASSERT_TRUE(coll_.GroupStart().ok());
  EXPECT_EQ(coll_.AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp{}, comms[0], *s1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(coll_.GroupEnd().ok());
}

TEST_F(FakeCollectivesTest, AbortReleasesAStalledCollectiveWithAnError) {
  auto comms = Init(2, {0, 1}, {0, 1});
  std::vector<device::StreamHandle> s = {*dev_.CreateStream(0, device::StreamPriority::kDefault),
                                         *dev_.CreateStream(1, device::StreamPriority::kDefault)};
  std::vector<device::DevicePtr> b = {*dev_.Allocate(0, 64), *dev_.Allocate(1, 64)};
  coll_.Stall(true);
  ASSERT_TRUE(coll_.GroupStart().ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(coll_.AllReduce(b[r], b[r], 4, DataType::kFloat32, RedOp{}, comms[r], s[r]).ok());
  }
  ASSERT_TRUE(coll_.GroupEnd().ok());
  auto ev = dev_.CreateEvent(0, false);
  ASSERT_TRUE(dev_.RecordEvent(*ev, s[0]).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(*dev_.EventDone(*ev));  // stuck, as with a lost peer
  ASSERT_TRUE(coll_.Release(comms, /*abort=*/true).ok());
  dev_.SyncStream(s[0]);
  auto done = dev_.EventDone(*ev);
  ASSERT_FALSE(done.ok());  // the work captured by the event failed
  EXPECT_EQ(done.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(coll_.live_comms(), 0);
  EXPECT_FALSE(coll_.AllReduce(b[0], b[0], 4, DataType::kFloat32, RedOp{}, comms[0], s[0]).ok());
}

// NCCL: finalize waits for global quiescence and abort synchronises a
// clique's local ranks, so one thread driving two ranks must end them in one
// group call; one at a time would hang.
TEST_F(FakeCollectivesTest, EndingOneOfTwoLocalRanksAloneIsRefused) {
  auto comms = Init(2, {0, 1}, {0, 1});
  for (bool abort : {false, true}) {
    absl::Status s = coll_.Release({comms[0]}, abort);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("would hang"), std::string::npos) << s;
  }
  EXPECT_EQ(coll_.live_comms(), 2);
  ASSERT_TRUE(coll_.Release(comms, /*abort=*/false).ok());
  EXPECT_EQ(coll_.live_comms(), 0);
  EXPECT_EQ(coll_.aborted_comms(), 0);
  // Another thread's communicators of the same clique (another daemon's
  // ranks) are not this thread's to end.
  auto other = Init(2, {0, 1}, {0, 1});
  std::thread t([&] { EXPECT_TRUE(coll_.Release({other[0]}, true).ok()); });
  t.join();
  // Rank 0 is gone: rank 1, the last of this thread's, may end alone.
  EXPECT_TRUE(coll_.Release({other[1]}, true).ok());
}

// Work queued behind an event that never fires: the release gives up after
// its bound (real NCCL's free would hang on the device synchronisation), and
// when that work starts later it is a kernel of a freed communicator.
TEST_F(FakeCollectivesTest, WorkQueuedBehindAStuckEventFaultsWhenItStartsAfterTheRelease) {
  coll_.set_release_bound(std::chrono::milliseconds(50));
  auto comms = Init(1, {0}, {0});
  auto s = dev_.CreateStream(0, device::StreamPriority::kDefault);
  auto producer = dev_.CreateStream(0, device::StreamPriority::kDefault);
  auto b = dev_.Allocate(0, 64);
  auto ev = dev_.CreateEvent(0, false);
  std::promise<void> gate;
  auto f = gate.get_future().share();
  ASSERT_TRUE(dev_.EnqueueHostFn(*producer, [f] { f.wait(); return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev_.RecordEvent(*ev, *producer).ok());
  ASSERT_TRUE(dev_.StreamWaitEvent(*s, *ev).ok());
  ASSERT_TRUE(coll_.AllReduce(*b, *b, 4, DataType::kFloat32, RedOp{}, comms[0], *s).ok());
  absl::Status r = coll_.Release(comms, /*abort=*/true);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded) << r;
  EXPECT_EQ(dev_.faults(), 0);
  gate.set_value();
  dev_.SyncStream(*producer);
  dev_.SyncStream(*s);
  EXPECT_EQ(dev_.faults(), 1);
  EXPECT_NE(dev_.first_fault().find("after its communicator was released"), std::string::npos)
      << dev_.first_fault();
}

TEST_F(FakeCollectivesTest, ShrinkRenumbersTheSurvivors) {
  auto comms = Init(2, {0, 1}, {0, 1});
  auto shrunk = coll_.ShrinkRanks(comms, {0});
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  ASSERT_EQ(shrunk->size(), 1u);
  // A single-rank clique may be driven without a group call.
  auto s1 = dev_.CreateStream(1, device::StreamPriority::kDefault);
  auto b = dev_.Allocate(1, 64);
  float v[4] = {1, 2, 3, 4};
  ASSERT_TRUE(dev_.CopyToDevice(*b, v, 16).ok());
  ASSERT_TRUE(coll_.AllReduce(*b, *b, 4, DataType::kFloat32, RedOp{}, (*shrunk)[0], *s1).ok());
  dev_.SyncStream(*s1);
  float out[4];
  ASSERT_TRUE(dev_.CopyToHost(out, *b, 16).ok());
  EXPECT_EQ(out[3], 4.0f);
}

}  // namespace
}  // namespace hsdp::nccl
