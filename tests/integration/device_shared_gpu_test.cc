// Several trainers on one GPU through a real hsdpd on the fake device
// (engine.device: fake; the fake NCCL refuses two ranks of a communicator on
// one device, as NCCL does): the NCCL engine's intra-device plan
// reduces and copies between the trainers' buffers on the device itself.
// Two trainers on device 0 run every collective; four run the HSDP
// composite on a 2x2 mesh. This is also the shape a one-GPU machine uses to
// exercise the daemon with two trainers (cuda_daemon_integration_test).
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "device_fake_util.h"
#include "device_ranks.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp {
namespace {

using testing::Await;
using testing::CheckEveryCollective2;
using testing::CheckHsdpComposite2x2;
using testing::DaemonProcess;
using testing::DeviceTrainer;
using testing::Expect;
using testing::FakeDeviceConfig;
using testing::In;
using testing::RunRanks;
using testing::TempDir;

constexpr uint64_t kCount = 512;
constexpr uint64_t kRecvOffset = 64 * 1024;
constexpr uint64_t kAllocBytes = 256 * 1024;

TEST(DeviceSharedGpuTest, TwoTrainersOnOneDeviceRunEveryCollective) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  constexpr int kWorld = 2;
  RunRanks(kWorld, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "shared", rank, kWorld, kAllocBytes, /*on_device=*/0)) return 1;
    auto g = T.client->NewGroup({0, 1});
    if (!g.ok()) return T.Fail("NewGroup"), 1;
    CheckEveryCollective2(&T, *g, kCount, kRecvOffset,
                          {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax});
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  });
  EXPECT_TRUE(d.Alive()) << d.Log();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DeviceSharedGpuTest, FourTrainersOnOneDeviceRunTheHsdpComposite) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(4, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "mesh", rank, 4, kAllocBytes, /*on_device=*/0)) return 1;
    if (!CheckHsdpComposite2x2(&T, kCount, kRecvOffset)) return 1;
    auto all = T.client->NewGroup({0, 1, 2, 3});
    if (!all.ok()) return T.Fail("NewGroup"), 1;
    // All four on the one device in one all-reduce.
    for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = In(rank, i);
    if (Await(&T, T.client->AllReduce(*all, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "all_reduce of 4")) {
      Expect(&T, "all_reduce of 4", T.F(kRecvOffset), kCount,
             [](uint64_t i) { return In(0, i) + In(1, i) + In(2, i) + In(3, i); });
    }
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  });
  EXPECT_TRUE(d.Alive()) << d.Log();
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
