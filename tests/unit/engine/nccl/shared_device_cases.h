// The cases of the several-members-per-GPU tests, shared by the
// fake-device test (nccl_shared_device_test.cc) and the real-GPU one
// (nccl_shared_device_gpu_test.cc): every collective and reduce option the
// NCCL engine runs, checked against a reference computed here. `Node` has
// `dev` (a DeviceApi) and `engine` (an NcclEngine).
#ifndef HSDP_TESTS_UNIT_NCCL_SHARED_DEVICE_CASES_H_
#define HSDP_TESTS_UNIT_NCCL_SHARED_DEVICE_CASES_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hsdp/kernels/reduce_kernels.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"

namespace hsdp::nccl::testing {

// A task over members on `devs` (member r on devs[r]) with buffers of
// `dtype` holding value(r, i) (converted), and the expected outputs.
struct Case {
  std::string name;
  Collective coll = Collective::kAllReduce;
  ReduceSpec spec;
  uint64_t count = 6;
  int root = 0;
  bool uneven = false;  // all-to-all: member r sends (r + j) % 3 elements to j
  // All-reduce: recv is send; reduce-scatter: recv is the member's own block of send.
  bool in_place = false;
};

inline double Value(int r, uint64_t i) { return double(r + 1) + 0.5 * double(i % 5); }

// Reads a buffer of `dtype` as doubles (through the CPU cast).
template <typename Node>
std::vector<double> ReadAs(Node& node, device::DevicePtr p, DataType dtype, uint64_t n) {
  std::vector<char> raw(n * DataTypeSize(dtype));
  EXPECT_TRUE(node.dev.CopyToHost(raw.data(), p, raw.size()).ok());
  std::vector<double> out(n);
  cpu::Cast(dtype, raw.data(), DataType::kFloat64, out.data(), n);
  return out;
}

template <typename Node>
device::DevicePtr Fill(Node& node, int d, DataType dtype, const std::vector<double>& v) {
  std::vector<char> raw(std::max<size_t>(1, v.size() * DataTypeSize(dtype)));
  cpu::Cast(DataType::kFloat64, v.data(), dtype, raw.data(), v.size());
  auto p = node.dev.Allocate(d, raw.size());
  EXPECT_TRUE(p.ok());
  EXPECT_TRUE(node.dev.CopyToDevice(*p, raw.data(), raw.size()).ok());
  return *p;
}

// Expected reduction of the members' element i under `spec` (the CPU
// kernels' semantics: pre-divide each input, combine, post-divide; AVG /n).
inline double Reduce(const ReduceSpec& spec, const std::vector<double>& x) {
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

template <typename Node>
void RunCase(Node& node, const std::vector<int>& devs, const Case& c, const std::string& group) {
  SCOPED_TRACE(c.name + " on devices " + ::testing::PrintToString(devs));
  const int n = static_cast<int>(devs.size());
  if (c.root >= n) return;  // a rooted case for more members than this machine has GPUs
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
    const size_t es = DataTypeSize(dt);
    if (c.in_place) {
      recv[r] = send[r] + (c.coll == Collective::kReduceScatter ? uint64_t(r) * c.count * es : 0);
    } else {
      recv[r] = Fill(node, devs[r], dt, std::vector<double>(out_n[r], -7.0));
    }
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

// Whether the engine's fused intra-device reduction (one GPU, no NCCL) takes `c`.
inline bool FusedOnOneDevice(const Case& c) {
  return (c.coll == Collective::kAllReduce || c.coll == Collective::kReduceScatter) &&
         c.spec.wire_dtype == DataType::kInvalid;
}

inline std::vector<Case> EveryCase() {
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
  add("all-reduce avg in place", Collective::kAllReduce, spec(ReduceOp::kAvg));
  cases.back().in_place = true;
  add("reduce-scatter sum", Collective::kReduceScatter, spec(ReduceOp::kSum));
  add("reduce-scatter sum in place", Collective::kReduceScatter, spec(ReduceOp::kSum));
  cases.back().in_place = true;
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

}  // namespace hsdp::nccl::testing

#endif  // HSDP_TESTS_UNIT_NCCL_SHARED_DEVICE_CASES_H_
