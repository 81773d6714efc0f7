// KindRoutingEngine and MakeDeviceAwareEngine: host tasks reach the CPU
// engine, device tasks the NCCL engine (on the fakes); tickets, dependencies
// and aborts translate across the two; engine.kind selection.
#include "daemon/engine/device_engine_factory.h"

#include <thread>

#include "daemon/engine/cpu/cpu_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"
#include "common/wait.h"

namespace hsdp {
namespace {

using nccl::testing::Member;
using nccl::testing::Pending;

struct Rig {
  Rig() : dev(std::make_shared<device::FakeDeviceApi>(2)) {
    auto coll = std::make_unique<nccl::FakeCollectives>(dev.get());
    fake = coll.get();
    engine = MakeRoutingEngine(std::make_unique<CpuEngine>(1, 1 << 20), dev, std::move(coll),
                               nccl::testing::FakeNode::FastOptions());
  }
  device::DevicePtr Buf(int d, std::vector<float> v) {
    auto p = dev->Allocate(d, v.size() * 4);
    EXPECT_TRUE(dev->CopyToDevice(*p, v.data(), v.size() * 4).ok());
    return *p;
  }
  float At(device::DevicePtr p) {
    float v;
    EXPECT_TRUE(dev->CopyToHost(&v, p, 4).ok());
    return v;
  }
  std::shared_ptr<device::FakeDeviceApi> dev;
  nccl::FakeCollectives* fake;
  std::unique_ptr<Engine> engine;
};

EngineTask DeviceAllReduce(Rig& rig, std::vector<device::DevicePtr>* bufs, float v,
                           const std::string& group = "g") {
  EngineTask t;
  t.collective = Collective::kAllReduce;
  t.count = 4;
  t.group_key = group;
  t.spec.dtype = DataType::kFloat32;
  for (int r = 0; r < 2; ++r) {
    bufs->push_back(rig.Buf(r, std::vector<float>(4, v)));
    t.members.push_back(Member(r, r, bufs->back(), bufs->back(), 16, 16));
  }
  return t;
}

TEST(DeviceEngineFactoryTest, RoutesEachTaskByMemoryKind) {
  Rig rig;
  EXPECT_EQ(rig.engine->name(), "cpu+nccl");
  EXPECT_TRUE(rig.engine->Supports(MemoryKind::kHost));
  EXPECT_TRUE(rig.engine->Supports(MemoryKind::kDevice));
  // Host: plain memory, the CPU engine.
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  EngineTask host;
  host.collective = Collective::kAllReduce;
  host.count = 4;
  host.group_key = "g";
  host.spec.dtype = DataType::kFloat32;
  for (auto* v : {&a, &b}) {
    EngineMember m;
    m.send = m.recv = BufferView{MemoryKind::kHost, -1, v->data(), 16};
    host.members.push_back(m);
  }
  Pending ph;
  const uint64_t t1 = rig.engine->Launch(host, ph.Callbacks());
  ASSERT_TRUE(ph.Wait().status.ok());
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_TRUE(rig.fake->calls().empty());
  // Device: the NCCL engine.
  std::vector<device::DevicePtr> bufs;
  Pending pd;
  const uint64_t t2 = rig.engine->Launch(DeviceAllReduce(rig, &bufs, 5.0f), pd.Callbacks());
  ASSERT_TRUE(pd.Wait().status.ok());
  EXPECT_EQ(rig.At(bufs[1]), 10.0f);
  EXPECT_EQ(rig.fake->calls().size(), 2u);
  EXPECT_NE(t1, t2);  // the router's own tickets
}

TEST(DeviceEngineFactoryTest, DependenciesAndAbortReachTheRightEngine) {
  Rig rig;
  std::vector<device::DevicePtr> bufs;
  rig.fake->Stall(true);
  Pending p1;
  const uint64_t t1 = rig.engine->Launch(DeviceAllReduce(rig, &bufs, 1.0f), p1.Callbacks());
  ASSERT_TRUE(hsdp::testing::Eventually([&] { return rig.fake->calls().size() >= 2; }, 2000, 1));
  std::vector<device::DevicePtr> bufs2;
  EngineTask dep = DeviceAllReduce(rig, &bufs2, 1.0f, "g2");
  dep.depends_on = {t1};
  Pending p2;
  rig.engine->Launch(dep, p2.Callbacks());
  rig.engine->Abort(t1, absl::AbortedError("member left"));
  // Only now: released earlier, t1 could finish before the abort reached it
  // (seen under ctest -j2 load).
  rig.fake->Stall(false);
  EXPECT_EQ(p1.Wait().status.code(), absl::StatusCode::kAborted);
  // The dependent saw its dependency fail (translated to the inner ticket).
  auto o2 = p2.Wait();
  EXPECT_FALSE(o2.status.ok());
}

TEST(DeviceEngineFactoryTest, EngineKindSelection) {
  auto cpu = MakeDeviceAwareEngine("cpu", std::make_unique<CpuEngine>(1, 1024));
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->engine->name(), "cpu");
  EXPECT_EQ(cpu->device, nullptr);
  auto bad = MakeDeviceAwareEngine("tpu", std::make_unique<CpuEngine>(1, 1024));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto automatic = MakeDeviceAwareEngine("auto", std::make_unique<CpuEngine>(1, 1024));
  ASSERT_TRUE(automatic.ok());
  auto nccl = MakeDeviceAwareEngine("nccl", std::make_unique<CpuEngine>(1, 1024));
  if (automatic->device == nullptr) {
    // No GPU here (or no CUDA in this build): auto keeps the CPU engine,
    // nccl is refused with the reason.
    EXPECT_EQ(automatic->engine->name(), "cpu");
    EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(nccl.status().message().find("nccl"), std::string::npos);
  } else {
    EXPECT_EQ(automatic->engine->name(), "cpu+nccl");
    EXPECT_TRUE(nccl.ok());
  }
}

}  // namespace
// engine.device: fake (tests only): the routing engine on the cross-process
// fake device, only with a device engine kind; unknown backends are refused.
TEST(DeviceEngineFactoryTest, FakeDeviceBackendIsExplicitAndNeedsADeviceKind) {
  auto fake = MakeDeviceAwareEngine("nccl", std::make_unique<CpuEngine>(1, 1024), {}, "fake");
  ASSERT_TRUE(fake.ok()) << fake.status();
  ASSERT_NE(fake->device, nullptr);
  EXPECT_EQ(fake->device->name(), "fake");
  EXPECT_EQ(fake->device->DeviceCount(), kFakeDevices);
  EXPECT_EQ(fake->engine->name(), "cpu+nccl");
  auto on_cpu = MakeDeviceAwareEngine("cpu", std::make_unique<CpuEngine>(1, 1024), {}, "fake");
  EXPECT_EQ(on_cpu.status().code(), absl::StatusCode::kInvalidArgument);
  auto rocm = MakeDeviceAwareEngine("nccl", std::make_unique<CpuEngine>(1, 1024), {}, "rocm");
  EXPECT_EQ(rocm.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace hsdp
