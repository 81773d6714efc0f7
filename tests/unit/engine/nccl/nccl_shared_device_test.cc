// Several members of a collective on one GPU: the fake NCCL
// refuses two ranks of a communicator on one device, as NCCL does, so these
// pass only through the engine's own intra-device plan (hsdpd's reduce and
// copy kernels within a device, NCCL with one rank per device between
// devices). Every collective and reduce option the NCCL engine supports, on
// 2 and 4 members on one device and on 4 members over 2 devices; one member
// per GPU still goes to NCCL directly; the HSDP composite on one device.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "hsdp/kernels/reduce_kernels.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"
#include "tests/unit/engine/nccl/shared_device_cases.h"

namespace hsdp::nccl {
namespace {

using testing::FakeNode;
using testing::Member;
using testing::Pending;
using testing::Case;
using testing::EveryCase;
using testing::Fill;
using testing::ReadAs;
using testing::RunCase;
using testing::Value;

class SharedDeviceTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(SharedDeviceTest, EveryCollective) {
  const std::vector<int> devs = GetParam();
  const int ndev = *std::max_element(devs.begin(), devs.end()) + 1;
  FakeNode node(ndev);
  int k = 0;
  for (const Case& c : EveryCase()) RunCase(node, devs, c, "g" + std::to_string(k++));
  // Every task took the intra-device plan; NCCL ran with one rank per device.
  EXPECT_EQ(node.engine.stats().shared_device_tasks, uint64_t(k));
  EXPECT_EQ(node.engine.stats().tasks_completed, uint64_t(k));
  for (const auto& call : node.coll.calls()) EXPECT_LT(call.rank, ndev);
  if (ndev == 1) {
    EXPECT_TRUE(node.coll.calls().empty()) << "one device: no NCCL at all";
    EXPECT_EQ(node.coll.inits(), 0);
    // Reductions without a reduce dtype went straight into the outputs.
    uint64_t fused = 0;
    for (const Case& c : EveryCase()) fused += testing::FusedOnOneDevice(c) ? 1 : 0;
    EXPECT_EQ(node.engine.stats().fused_shared_reduces, fused);
  } else {
    EXPECT_FALSE(node.coll.calls().empty());
    EXPECT_EQ(node.engine.stats().fused_shared_reduces, 0u);
  }
  EXPECT_EQ(node.dev.faults(), 0) << node.dev.first_fault();
}

INSTANTIATE_TEST_SUITE_P(Layouts, SharedDeviceTest,
                         ::testing::Values(std::vector<int>{0, 0}, std::vector<int>{0, 0, 0, 0},
                                           std::vector<int>{0, 1, 0, 1},
                                           std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{1, 1, 0, 0, 1},
                                           std::vector<int>(10, 0)),
                         [](const auto& info) {
                           std::string name = "devices";
                           for (int d : info.param) name += "_" + std::to_string(d);
                           return name;
                         });

// An output that overlaps an input partially (not the same range) would let
// the fused kernel read what it already wrote: such a task takes the scratch
// path, and the result is the reduction of the inputs as they were.
TEST(SharedDevicePlanTest, PartialOverlapTakesTheScratchPath) {
  FakeNode node(1);
  const device::DevicePtr a = node.Buffer<float>(0, {1, 2, 3, 4, 0, 0});
  const device::DevicePtr b = node.Buffer<float>(0, {10, 20, 30, 40});
  const device::DevicePtr out1 = node.Buffer<float>(0, {0, 0, 0, 0});
  EngineTask t;
  t.collective = Collective::kAllReduce;
  t.count = 4;
  t.group_key = "overlap";
  t.spec.dtype = DataType::kFloat32;
  t.members.push_back(testing::Member(0, 0, a, a + 2 * sizeof(float), 16, 16));  // recv = a[2..6)
  t.members.push_back(testing::Member(1, 0, b, out1, 16, 16));
  Pending p;
  node.engine.Launch(t, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  const std::vector<float> want = {11, 22, 33, 44};
  EXPECT_EQ(node.Read<float>(a + 2 * sizeof(float), 4), want);
  EXPECT_EQ(node.Read<float>(out1, 4), want);
  EXPECT_EQ(node.engine.stats().shared_device_tasks, 1u);
  EXPECT_EQ(node.engine.stats().fused_shared_reduces, 0u);

  // The same inputs, in place: fused.
  const device::DevicePtr c = node.Buffer<float>(0, {1, 2, 3, 4});
  const device::DevicePtr d = node.Buffer<float>(0, {10, 20, 30, 40});
  t.members[0] = testing::Member(0, 0, c, c, 16, 16);
  t.members[1] = testing::Member(1, 0, d, d, 16, 16);
  Pending q;
  node.engine.Launch(t, q.Callbacks());
  ASSERT_TRUE(q.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(c, 4), want);
  EXPECT_EQ(node.Read<float>(d, 4), want);
  EXPECT_EQ(node.engine.stats().fused_shared_reduces, 1u);
}

// One member per GPU keeps NCCL directly: n ranks, no intra-device kernels.
TEST(SharedDevicePlanTest, OneMemberPerGpuUsesNcclDirectly) {
  FakeNode node(3);
  Case c;
  c.spec.dtype = DataType::kFloat32;
  c.spec.op = ReduceOp::kSum;
  RunCase(node, {0, 1, 2}, c, "g");
  EXPECT_EQ(node.engine.stats().shared_device_tasks, 0u);
  ASSERT_EQ(node.coll.batches().size(), 1u);
  EXPECT_EQ(node.coll.batches()[0].size(), 3u);  // one all-reduce call per rank
}

// Between devices, a reduce-scatter is an NCCL reduce-scatter when every
// device holds an equal, contiguous run of members, else an all-reduce.
TEST(SharedDevicePlanTest, ReduceScatterBetweenDevicesFollowsTheLayout) {
  for (const auto& [devs, kind] :
       {std::pair<std::vector<int>, std::string>{{0, 0, 1, 1}, "reduce_scatter"},
        std::pair<std::vector<int>, std::string>{{0, 1, 0, 1}, "all_reduce"},
        std::pair<std::vector<int>, std::string>{{0, 0, 0, 1}, "all_reduce"}}) {
    FakeNode node(2);
    Case c;
    c.coll = Collective::kReduceScatter;
    c.spec.dtype = DataType::kFloat32;
    c.spec.op = ReduceOp::kAvg;
    RunCase(node, devs, c, "g");
    const auto calls = node.coll.calls();
    ASSERT_EQ(calls.size(), 2u);  // one call per device
    for (const auto& call : calls) EXPECT_EQ(call.kind, kind);
  }
}

// The fake NCCL refuses two ranks of one communicator on one device, as NCCL
// does: the intra-device plan is what makes the cases above work.
TEST(SharedDevicePlanTest, TheFakeNcclRefusesTwoRanksOnOneDevice) {
  FakeNode node(1);
  auto id = node.coll.NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto comms = node.coll.InitRanks(*id, 2, {0, 1}, {0, 0});
  EXPECT_EQ(comms.status().code(), absl::StatusCode::kInvalidArgument);
}

// The HSDP composite on four members of one GPU: reduce-scatter within the
// shard groups {0,1} and {2,3}, then all-reduce of the shards across the
// replicate groups {0,2} and {1,3}, which depend on it (on the device).
TEST(SharedDevicePlanTest, HsdpCompositeOnOneDevice) {
  FakeNode node(1);
  const uint64_t shard = 4;
  std::vector<device::DevicePtr> in(4), mid(4);
  for (int r = 0; r < 4; ++r) {
    std::vector<double> v(shard * 2);
    for (uint64_t i = 0; i < v.size(); ++i) v[i] = Value(r, i);
    in[r] = Fill(node, 0, DataType::kFloat32, v);
    mid[r] = Fill(node, 0, DataType::kFloat32, std::vector<double>(shard, 0));
  }
  std::vector<uint64_t> rs_tickets;
  std::vector<Pending> rs(2), ar(2);
  for (int g = 0; g < 2; ++g) {
    EngineTask t;
    t.collective = Collective::kReduceScatter;
    t.count = shard;
    t.group_key = "shard" + std::to_string(g);
    t.spec.dtype = DataType::kFloat32;
    t.spec.op = ReduceOp::kAvg;
    for (int k = 0; k < 2; ++k) {
      const int r = 2 * g + k;
      t.members.push_back(Member(r, 0, in[r], mid[r], shard * 8, shard * 4));
    }
    rs_tickets.push_back(node.engine.Launch(t, rs[g].Callbacks()));
  }
  for (int g = 0; g < 2; ++g) {
    EngineTask t;
    t.collective = Collective::kAllReduce;
    t.count = shard;
    t.group_key = "replicate" + std::to_string(g);
    t.spec.dtype = DataType::kFloat32;
    t.spec.op = ReduceOp::kAvg;
    t.depends_on = rs_tickets;
    for (int k = 0; k < 2; ++k) {
      const int r = g + 2 * k;
      t.members.push_back(Member(r, 0, mid[r], mid[r], shard * 4, shard * 4));
    }
    node.engine.Launch(t, ar[g].Callbacks());
  }
  for (auto* p : {&rs[0], &rs[1], &ar[0], &ar[1]}) ASSERT_TRUE(p->Wait().status.ok());
  // Member r holds block (r % 2) of the average over all four inputs.
  for (int r = 0; r < 4; ++r) {
    const auto got = ReadAs(node, mid[r], DataType::kFloat32, shard);
    for (uint64_t i = 0; i < shard; ++i) {
      double want = 0;
      for (int j = 0; j < 4; ++j) want += Value(j, (r % 2) * shard + i) / 4;
      ASSERT_NEAR(got[i], want, 1e-5) << r << " " << i;
    }
  }
  EXPECT_EQ(node.coll.inits(), 0);
}

}  // namespace
}  // namespace hsdp::nccl
