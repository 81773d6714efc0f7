// Several members of a collective on one GPU (issue 20): the fake NCCL
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

#include "daemon/engine/cpu/reduce_kernels.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/nccl/engine_test_util.h"

namespace hsdp::nccl {
namespace {

using testing::FakeNode;
using testing::Member;
using testing::Pending;

// A task over members on `devs` (member r on devs[r]) with buffers of
// `dtype` holding value(r, i) (converted), and the expected outputs.
struct Case {
  std::string name;
  Collective coll = Collective::kAllReduce;
  ReduceSpec spec;
  uint64_t count = 6;
  int root = 0;
  bool uneven = false;  // all-to-all: member r sends (r + j) % 3 elements to j
};

double Value(int r, uint64_t i) { return double(r + 1) + 0.5 * double(i % 5); }

// Reads a buffer of `dtype` as doubles (through the CPU cast).
std::vector<double> ReadAs(FakeNode& node, device::DevicePtr p, DataType dtype, uint64_t n) {
  std::vector<char> raw(n * DataTypeSize(dtype));
  EXPECT_TRUE(node.dev.CopyToHost(raw.data(), p, raw.size()).ok());
  std::vector<double> out(n);
  cpu::Cast(dtype, raw.data(), DataType::kFloat64, out.data(), n);
  return out;
}

device::DevicePtr Fill(FakeNode& node, int d, DataType dtype, const std::vector<double>& v) {
  std::vector<char> raw(std::max<size_t>(1, v.size() * DataTypeSize(dtype)));
  cpu::Cast(DataType::kFloat64, v.data(), dtype, raw.data(), v.size());
  auto p = node.dev.Allocate(d, raw.size());
  EXPECT_TRUE(p.ok());
  EXPECT_TRUE(node.dev.CopyToDevice(*p, raw.data(), raw.size()).ok());
  return *p;
}

// Expected reduction of the members' element i under `spec` (the CPU
// kernels' semantics: pre-divide each input, combine, post-divide; AVG /n).
double Reduce(const ReduceSpec& spec, const std::vector<double>& x) {
  double a = 0;
  const int n = static_cast<int>(x.size());
  switch (spec.op) {
    case ReduceOp::kMin: a = x[0]; for (double v : x) a = std::min(a, v); return a / (spec.pre_divide * spec.post_divide);
    case ReduceOp::kMax: a = x[0]; for (double v : x) a = std::max(a, v); return a / (spec.pre_divide * spec.post_divide);
    case ReduceOp::kProduct: a = 1; for (double v : x) a *= v / spec.pre_divide; return a / spec.post_divide;
    case ReduceOp::kPremulSum: for (double v : x) a += v * spec.premul_factor / spec.pre_divide; return a / spec.post_divide;
    case ReduceOp::kAvg: for (double v : x) a += v / spec.pre_divide; return a / spec.post_divide / n;
    default: for (double v : x) a += v / spec.pre_divide; return a / spec.post_divide;
  }
}

void RunCase(FakeNode& node, const std::vector<int>& devs, const Case& c, const std::string& group) {
  SCOPED_TRACE(c.name + " on devices " + ::testing::PrintToString(devs));
  const int n = static_cast<int>(devs.size());
  const DataType dt = c.spec.dtype;
  EngineTask t;
  t.collective = c.coll;
  t.count = c.count;
  t.root = c.root;
  t.group_key = group;
  t.spec = c.spec;
  auto sc = [&](int r, int j) -> uint64_t { return c.uneven ? uint64_t((r + j) % 3) : c.count; };
  std::vector<uint64_t> in_n(n), out_n(n);
  for (int r = 0; r < n; ++r) {
    switch (c.coll) {
      case Collective::kAllGather: in_n[r] = c.count; out_n[r] = c.count * n; break;
      case Collective::kReduceScatter: in_n[r] = c.count * n; out_n[r] = c.count; break;
      case Collective::kAllToAll:
        in_n[r] = out_n[r] = 0;
        for (int j = 0; j < n; ++j) { in_n[r] += sc(r, j); out_n[r] += sc(j, r); }
        break;
      default: in_n[r] = out_n[r] = c.count;
    }
  }
  std::vector<std::vector<double>> in(n);
  std::vector<device::DevicePtr> send(n), recv(n);
  for (int r = 0; r < n; ++r) {
    for (uint64_t i = 0; i < in_n[r]; ++i) in[r].push_back(Value(r, i));
    send[r] = Fill(node, devs[r], dt, in[r]);
    in[r] = ReadAs(node, send[r], dt, in_n[r]);  // what the dtype holds
    recv[r] = Fill(node, devs[r], dt, std::vector<double>(out_n[r], -7.0));
    const size_t es = DataTypeSize(dt);
    EngineMember m = Member(r, devs[r], send[r], recv[r], in_n[r] * es, out_n[r] * es);
    if (c.uneven) {
      for (int j = 0; j < n; ++j) {
        m.send_counts.push_back(sc(r, j));
        m.recv_counts.push_back(sc(j, r));
      }
    }
    t.members.push_back(m);
  }
  Pending p;
  node.engine.Launch(t, p.Callbacks());
  auto o = p.Wait();
  ASSERT_TRUE(o.status.ok()) << o.status;
  const bool narrow = DataTypeSize(dt) == 2 ||
                      (c.spec.wire_dtype != DataType::kInvalid && DataTypeSize(c.spec.wire_dtype) == 2);
  const double tol = narrow ? 0.02 : 1e-5;
  for (int r = 0; r < n; ++r) {
    const std::vector<double> got = ReadAs(node, recv[r], dt, out_n[r]);
    std::vector<double> want(out_n[r]);
    for (uint64_t i = 0; i < out_n[r]; ++i) {
      std::vector<double> x;
      switch (c.coll) {
        case Collective::kAllReduce:
          for (int j = 0; j < n; ++j) x.push_back(in[j][i]);
          want[i] = Reduce(c.spec, x);
          break;
        case Collective::kReduceScatter:
          for (int j = 0; j < n; ++j) x.push_back(in[j][r * c.count + i]);
          want[i] = Reduce(c.spec, x);
          break;
        case Collective::kAllGather: want[i] = in[i / c.count][i % c.count]; break;
        case Collective::kBroadcast: want[i] = in[c.root][i]; break;
        default: {  // all-to-all: block j of r's output is block r of j's input
          uint64_t at = i;
          int j = 0;
          while (at >= sc(j, r)) at -= sc(j++, r);
          uint64_t off = 0;
          for (int k = 0; k < r; ++k) off += sc(j, k);
          want[i] = in[j][off + at];
        }
      }
      if (!IsFloatingPoint(dt)) want[i] = std::trunc(want[i]);
      ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i])))
          << "member " << r << " [" << i << "]";
    }
  }
}

std::vector<Case> EveryCase() {
  auto spec = [](ReduceOp op, DataType dt = DataType::kFloat32) {
    ReduceSpec s;
    s.op = op;
    s.dtype = dt;
    return s;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, Collective coll, ReduceSpec s) {
    Case c;
    c.name = std::move(name);
    c.coll = coll;
    c.spec = s;
    cases.push_back(c);
  };
  add("all-reduce sum", Collective::kAllReduce, spec(ReduceOp::kSum));
  add("all-reduce avg", Collective::kAllReduce, spec(ReduceOp::kAvg));
  add("all-reduce min", Collective::kAllReduce, spec(ReduceOp::kMin));
  add("all-reduce max", Collective::kAllReduce, spec(ReduceOp::kMax));
  add("all-reduce product", Collective::kAllReduce, spec(ReduceOp::kProduct));
  ReduceSpec premul = spec(ReduceOp::kPremulSum);
  premul.premul_factor = 0.25;
  add("all-reduce premul_sum", Collective::kAllReduce, premul);
  ReduceSpec divide = spec(ReduceOp::kSum);
  divide.pre_divide = 2.0;
  divide.post_divide = 4.0;
  add("all-reduce pre/post divide", Collective::kAllReduce, divide);
  ReduceSpec avg_divide = spec(ReduceOp::kAvg);
  avg_divide.pre_divide = 2.0;
  add("all-reduce avg with pre-divide", Collective::kAllReduce, avg_divide);
  ReduceSpec wire = spec(ReduceOp::kAvg);
  wire.wire_dtype = DataType::kBFloat16;  // reduce dtype: the wire is bfloat16
  add("all-reduce avg, reduce dtype bfloat16", Collective::kAllReduce, wire);
  add("all-reduce sum bfloat16", Collective::kAllReduce, spec(ReduceOp::kSum, DataType::kBFloat16));
  add("all-reduce sum float64", Collective::kAllReduce, spec(ReduceOp::kSum, DataType::kFloat64));
  add("all-reduce sum int32", Collective::kAllReduce, spec(ReduceOp::kSum, DataType::kInt32));
  add("all-reduce max int64", Collective::kAllReduce, spec(ReduceOp::kMax, DataType::kInt64));
  add("reduce-scatter sum", Collective::kReduceScatter, spec(ReduceOp::kSum));
  add("reduce-scatter avg", Collective::kReduceScatter, spec(ReduceOp::kAvg));
  ReduceSpec rs_divide = spec(ReduceOp::kSum, DataType::kFloat16);
  rs_divide.pre_divide = 2.0;
  add("reduce-scatter float16 pre-divide", Collective::kReduceScatter, rs_divide);
  add("all-gather", Collective::kAllGather, spec(ReduceOp::kSum));
  add("all-gather int32", Collective::kAllGather, spec(ReduceOp::kSum, DataType::kInt32));
  add("broadcast", Collective::kBroadcast, spec(ReduceOp::kSum));
  cases.back().root = 1;
  add("all-to-all", Collective::kAllToAll, spec(ReduceOp::kSum));
  add("all-to-all uneven", Collective::kAllToAll, spec(ReduceOp::kSum));
  cases.back().uneven = true;
  return cases;
}

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
  } else {
    EXPECT_FALSE(node.coll.calls().empty());
  }
  EXPECT_EQ(node.dev.faults(), 0) << node.dev.first_fault();
}

INSTANTIATE_TEST_SUITE_P(Layouts, SharedDeviceTest,
                         ::testing::Values(std::vector<int>{0, 0}, std::vector<int>{0, 0, 0, 0},
                                           std::vector<int>{0, 1, 0, 1},
                                           std::vector<int>{1, 1, 0, 0, 1}),
                         [](const auto& info) {
                           std::string name = "devices";
                           for (int d : info.param) name += "_" + std::to_string(d);
                           return name;
                         });

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
