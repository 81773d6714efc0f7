// SharedDevicePlan on its own: which members share a device (one NCCL rank
// per device, first appearance first), the layouts that decide between an
// NCCL reduce-scatter and an all-reduce between devices, when a reduction
// on one device is fused into the outputs, and the scales and op the
// intra-device reduction runs with. The end-to-end cases are in
// nccl_shared_device_test.cc.
#include "daemon/engine/nccl/shared_device_plan.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

using Between = SharedDevicePlan::Between;

// A task of `n` float32 members of `count` elements whose buffers lie apart
// (fake addresses: the plan only compares them).
EngineTask Task(Collective c, int n, uint64_t count = 4, ReduceOp op = ReduceOp::kSum) {
  EngineTask t;
  t.collective = c;
  t.count = count;
  t.spec.dtype = DataType::kFloat32;
  t.spec.op = op;
  const uint64_t in = c == Collective::kReduceScatter ? count * n * 4 : count * 4;
  for (int r = 0; r < n; ++r) {
    EngineMember m;
    m.global_rank = r;
    m.send.data = reinterpret_cast<void*>(uintptr_t{0x100000} + r * 0x10000);
    m.recv.data = reinterpret_cast<void*>(uintptr_t{0x800000} + r * 0x10000);
    m.send.bytes = in;
    m.recv.bytes = count * 4;
    t.members.push_back(m);
  }
  return t;
}

void* At(void* base, uint64_t bytes) { return static_cast<char*>(base) + bytes; }

// The plan of `t` over members on `devs` (member r on devs[r]), as the engine
// builds it: ranks by first appearance, no communicator on one device.
SharedDevicePlan PlanOn(const std::vector<int>& devs) {
  SharedDevicePlan::Ranks ranks = SharedDevicePlan::AssignRanks(devs);
  const int comms = ranks.devices.size() == 1 ? 0 : static_cast<int>(ranks.devices.size());
  return SharedDevicePlan(ranks.comm_of, comms);
}

TEST(SharedDevicePlanRanksTest, OneRankPerDeviceInOrderOfFirstAppearance) {
  SharedDevicePlan::Ranks r = SharedDevicePlan::AssignRanks({1, 1, 0, 0, 1});
  EXPECT_EQ(r.comm_of, (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(r.devices, (std::vector<int>{1, 0}));
  EXPECT_TRUE(r.shared());

  r = SharedDevicePlan::AssignRanks({0, 1, 2});
  EXPECT_EQ(r.comm_of, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r.devices, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(r.shared()) << "one member per GPU: NCCL directly";

  r = SharedDevicePlan::AssignRanks(std::vector<int>(10, 3));
  EXPECT_EQ(r.comm_of, std::vector<int>(10, 0));
  EXPECT_EQ(r.devices, std::vector<int>{3});
  EXPECT_TRUE(r.shared());
}

TEST(SharedDevicePlanLayoutTest, MembersPerDevice) {
  SharedDevicePlan interleaved = PlanOn({0, 1, 0, 1});
  EXPECT_TRUE(interleaved.nccl());
  ASSERT_EQ(interleaved.devices(), 2);
  EXPECT_EQ(interleaved.members(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(interleaved.members(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(interleaved.device_of(3), 1);
  EXPECT_FALSE(interleaved.ContiguousRuns());

  SharedDevicePlan mixed = PlanOn({1, 1, 0, 0, 1});
  ASSERT_EQ(mixed.devices(), 2);
  EXPECT_EQ(mixed.members(0), (std::vector<int>{0, 1, 4}));  // device 1 came first
  EXPECT_EQ(mixed.members(1), (std::vector<int>{2, 3}));
  EXPECT_FALSE(mixed.ContiguousRuns());

  SharedDevicePlan one = PlanOn({0, 0, 0, 0});
  EXPECT_FALSE(one.nccl()) << "every member on one device: no communicator";
  ASSERT_EQ(one.devices(), 1);
  EXPECT_EQ(one.members(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(one.ContiguousRuns());
}

TEST(SharedDevicePlanLayoutTest, ContiguousRunsNeedEqualRunsInMemberOrder) {
  EXPECT_TRUE(PlanOn({0, 0, 1, 1}).ContiguousRuns());
  EXPECT_TRUE(PlanOn({1, 1, 0, 0}).ContiguousRuns()) << "device order is the rank order";
  EXPECT_TRUE(PlanOn({0, 0, 0, 1, 1, 1}).ContiguousRuns());
  EXPECT_FALSE(PlanOn({0, 0, 0, 1}).ContiguousRuns()) << "unequal runs";
  EXPECT_FALSE(PlanOn({0, 1, 0, 1}).ContiguousRuns()) << "interleaved";
  EXPECT_FALSE(PlanOn({0, 0, 1, 1, 0, 0}).ContiguousRuns()) << "a device's members apart";
}

TEST(SharedDevicePlanReduceTest, ReduceScatterBetweenDevicesFollowsTheLayout) {
  const EngineTask rs = Task(Collective::kReduceScatter, 4);
  const std::vector<std::pair<std::vector<int>, Between>> layouts = {
      {{0, 0, 1, 1}, Between::kReduceScatter},
      {{0, 1, 0, 1}, Between::kAllReduce},
      {{0, 0, 0, 1}, Between::kAllReduce},
      {{0, 0, 0, 0}, Between::kNone}};
  for (const auto& [devs, want] : layouts) {
    auto red = PlanOn(devs).PlanReduction(rs, /*fuse=*/false);
    ASSERT_TRUE(red.ok()) << red.status();
    EXPECT_EQ(red->between, want) << ::testing::PrintToString(devs);
    EXPECT_FALSE(red->fused);
  }
  // An all-reduce between devices is an all-reduce, contiguous or not.
  auto ar = PlanOn({0, 0, 1, 1}).PlanReduction(Task(Collective::kAllReduce, 4), true);
  ASSERT_TRUE(ar.ok());
  EXPECT_EQ(ar->between, Between::kAllReduce);
  EXPECT_FALSE(ar->fused) << "never fused across devices";
}

TEST(SharedDevicePlanReduceTest, OneDeviceFusesUnlessAReduceDtypeOrTheOptionSaysNo) {
  const SharedDevicePlan one = PlanOn({0, 0, 0});
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter}) {
    EngineTask t = Task(c, 3);
    auto red = one.PlanReduction(t, /*fuse=*/true);
    ASSERT_TRUE(red.ok());
    EXPECT_TRUE(red->fused);
    EXPECT_EQ(red->between, Between::kNone);
    EXPECT_EQ(red->wire, DataType::kFloat32);

    EXPECT_FALSE(one.PlanReduction(t, /*fuse=*/false)->fused);

    t.spec.wire_dtype = DataType::kBFloat16;  // the accumulator is bfloat16: scratch
    red = one.PlanReduction(t, true);
    ASSERT_TRUE(red.ok());
    EXPECT_FALSE(red->fused);
    EXPECT_EQ(red->wire, DataType::kBFloat16);
  }
}

TEST(SharedDevicePlanReduceTest, ScalesAndOpFollowTheReducePlan) {
  const SharedDevicePlan plan = PlanOn({0, 0, 1, 1});
  auto plan_of = [&](ReduceSpec spec) {
    EngineTask t = Task(Collective::kAllReduce, 4);
    spec.dtype = DataType::kFloat32;
    t.spec = spec;
    auto red = plan.PlanReduction(t, true);
    EXPECT_TRUE(red.ok()) << red.status();
    return red.ok() ? *red : SharedDevicePlan::Reduce{};
  };
  ReduceSpec s;
  s.op = ReduceOp::kAvg;  // ncclAvg is not used within a device: sum, then 1/n
  SharedDevicePlan::Reduce r = plan_of(s);
  EXPECT_EQ(r.op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(r.in_scale, 1.0);
  EXPECT_DOUBLE_EQ(r.out_scale, 0.25);

  s.op = ReduceOp::kPremulSum;
  s.premul_factor = 0.5;
  r = plan_of(s);
  EXPECT_EQ(r.op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(r.in_scale, 0.5);
  EXPECT_DOUBLE_EQ(r.out_scale, 1.0);

  s = ReduceSpec{};
  s.op = ReduceOp::kSum;
  s.pre_divide = 2.0;
  s.post_divide = 4.0;
  r = plan_of(s);
  EXPECT_EQ(r.op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(r.in_scale, 0.5);
  EXPECT_DOUBLE_EQ(r.out_scale, 0.25);

  s = ReduceSpec{};
  s.op = ReduceOp::kAvg;
  s.pre_divide = 2.0;
  r = plan_of(s);
  EXPECT_EQ(r.op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(r.in_scale, 0.5);
  EXPECT_DOUBLE_EQ(r.out_scale, 0.25);

  s = ReduceSpec{};
  s.op = ReduceOp::kMax;
  s.post_divide = 2.0;
  r = plan_of(s);
  EXPECT_EQ(r.op, ReduceOp::kMax);
  EXPECT_DOUBLE_EQ(r.in_scale, 1.0);
  EXPECT_DOUBLE_EQ(r.out_scale, 0.5);
}

TEST(SharedDevicePlanReduceTest, WhatTheReducePlanRefusesIsRefused) {
  EngineTask t = Task(Collective::kAllReduce, 2, 4, ReduceOp::kAvg);
  t.spec.dtype = DataType::kInt32;
  auto red = PlanOn({0, 0}).PlanReduction(t, true);
  EXPECT_EQ(red.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(SharedDevicePlanFusableTest, OutputsApartOrAtTheSameIndexFuse) {
  EngineTask ar = Task(Collective::kAllReduce, 2);
  EXPECT_TRUE(SharedDevicePlan::FusableInPlace(ar, 16, false)) << "apart";
  for (EngineMember& m : ar.members) m.recv.data = m.send.data;
  EXPECT_TRUE(SharedDevicePlan::FusableInPlace(ar, 16, false)) << "in place";
  ar.members[0].recv.data = At(ar.members[0].send.data, 8);
  EXPECT_FALSE(SharedDevicePlan::FusableInPlace(ar, 16, false)) << "a partial overlap";
  ar.members[0].recv.data = ar.members[1].send.data;
  EXPECT_TRUE(SharedDevicePlan::FusableInPlace(ar, 16, false))
      << "another member's whole input, read at the same index";

  EngineTask rs = Task(Collective::kReduceScatter, 2);
  for (int r = 0; r < 2; ++r) rs.members[r].recv.data = At(rs.members[r].send.data, r * 16);
  EXPECT_TRUE(SharedDevicePlan::FusableInPlace(rs, 16, true)) << "each its own block";
  rs.members[0].recv.data = At(rs.members[0].send.data, 16);
  EXPECT_FALSE(SharedDevicePlan::FusableInPlace(rs, 16, true)) << "member 0 into block 1";
}

TEST(SharedDevicePlanFusableTest, APartialOverlapTakesTheScratchPath) {
  EngineTask t = Task(Collective::kAllReduce, 2);
  t.members[0].recv.data = At(t.members[0].send.data, 8);
  auto red = PlanOn({0, 0}).PlanReduction(t, true);
  ASSERT_TRUE(red.ok());
  EXPECT_FALSE(red->fused);
  EXPECT_EQ(red->between, Between::kNone);
}

}  // namespace
}  // namespace hsdp::nccl
