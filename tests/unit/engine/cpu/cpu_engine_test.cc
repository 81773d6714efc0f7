// CpuEngine collectives on plain heap buffers against an independent
// reference computed in double, for 1..4 ranks, odd counts, every dtype,
// in-place and out-of-place, single-threaded and on a pool; and the
// engine's queue order (all-gather / reduce-scatter before all-reduce).
#include "daemon/engine/cpu/cpu_engine.h"

#include <sched.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <string>
#include <mutex>
#include <vector>

#include "bench_util.h"
#include "common/reduce_reference.h"  // Input, Tolerance, Combine, WrapInt
#include "common/wait.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "daemon/engine/cpu/thread_pool.h"
#include "daemon/util/clock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

// A local host member reading `send` and writing `recv`.
void AddRank(EngineTask* t, const void* send, void* recv) {
  EngineMember m;
  m.global_rank = static_cast<int>(t->members.size());
  m.send.data = const_cast<void*>(send);
  m.recv.data = recv;
  t->members.push_back(m);
}

// Launches with `done` as the completion (the launched step is checked to
// come first, exactly once).
template <typename Done>
void Submit(CpuEngine* engine, EngineTask task, Done done) {
  auto launched = std::make_shared<int>(0);
  EngineCallbacks cb;
  cb.launched = [launched](uint64_t ticket) {
    EXPECT_GT(ticket, 0u);
    ++*launched;
  };
  cb.completed = [launched, done](absl::Status s, uint64_t ns) mutable {
    EXPECT_EQ(*launched, 1) << "launched must precede completed, once";
    done(std::move(s), ns);
  };
  engine->Launch(std::move(task), std::move(cb));
}

using bench::LoadAs;
using bench::StoreAs;
using testing::Combine;
using testing::Input;
using testing::Tolerance;
using testing::WrapInt;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};

// A reduce dtype rounds the result too.
double Tol(const ReduceSpec& s, double expect) {
  double tol = Tolerance(s.dtype, expect);
  if (s.wire_dtype != DataType::kInvalid) tol = std::max(tol, Tolerance(s.wire_dtype, expect));
  return tol;
}

// The reduced value of element i across n ranks (reference semantics).
double Reference(const ReduceSpec& s, int n, uint64_t i) {
  const DataType t = s.dtype;
  if (!IsFloatingPoint(t)) {
    int64_t acc = int64_t(Input(t, 0, i));
    for (int r = 1; r < n; ++r) {
      acc = Combine(s.op, acc, int64_t(Input(t, r, i)));
    }
    double w = WrapInt(t, acc);
    if (s.op == ReduceOp::kAvg) w = std::trunc(w / n);
    return w;
  }
  auto pre = [&](double x) {
    if (s.op == ReduceOp::kPremulSum) return x * s.premul_factor / s.pre_divide;
    return x / s.pre_divide;
  };
  double acc = pre(Input(t, 0, i));
  for (int r = 1; r < n; ++r) {
    acc = Combine(s.op, acc, pre(Input(t, r, i)));
  }
  acc /= s.post_divide;
  if (s.op == ReduceOp::kAvg) acc /= n;
  return acc;
}

struct Buffers {
  std::vector<std::vector<uint64_t>> send, recv;  // uint64_t: 8-byte aligned storage
  Buffers(int n, uint64_t send_bytes, uint64_t recv_bytes) {
    for (int r = 0; r < n; ++r) {
      send.emplace_back(send_bytes / 8 + 1, 0xdeadbeefdeadbeefull);
      recv.emplace_back(recv_bytes / 8 + 1, 0xdeadbeefdeadbeefull);
    }
  }
};

class CpuEngineCollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  cpu::ThreadPool pool_{3};

  // Runs the task on the pool for large counts, inline otherwise; in
  // slices of `slice_` elements (as the engine's queue does) when set.
  void Run(const EngineTask& t, uint64_t count) {
    cpu::ThreadPool* pool = count > 50000 ? &pool_ : nullptr;
    if (slice_ == 0 || !CpuEngine::Sliceable(t)) return CpuEngine::Run(t, pool);
    for (uint64_t b = 0; b < t.count; b += slice_) {
      CpuEngine::RunRange(t, pool, b, std::min(t.count, b + slice_));
    }
  }
  uint64_t slice_ = 0;

  // All-reduce of `count` elements; `in_place` uses send == recv.
  void CheckAllReduce(const ReduceSpec& spec, uint64_t count, bool in_place) {
    const DataType t = spec.dtype;
    const size_t es = DataTypeSize(t);
    Buffers b(n(), count * es, count * es);
    EngineTask task;
    task.collective = Collective::kAllReduce;
    task.spec = spec;
    task.count = count;
    for (int r = 0; r < n(); ++r) {
      void* in = b.send[r].data();
      for (uint64_t i = 0; i < count; ++i) StoreAs(t, in, i, Input(t, r, i));
      AddRank(&task, in,
              in_place ? in : b.recv[r].data());
    }
    Run(task, count);
    int wrong = 0;
    for (int r = 0; r < n(); ++r) {
      for (uint64_t i = 0; i < count && wrong < 5; ++i) {
        const double want = Reference(spec, n(), i);
        const double got = LoadAs(t, task.members[r].recv.data, i);
        if (!(std::fabs(got - want) <= Tol(spec, want))) {
          ++wrong;
          ADD_FAILURE() << "all-reduce " << DataTypeName(t) << " " << ReduceOpName(spec.op)
                        << " n=" << n() << " count=" << count << (in_place ? " in-place" : "")
                        << " rank " << r << " [" << i << "]: got " << got << ", want " << want;
        }
      }
      // Nothing written past the end.
      if (!in_place) {
        const uint64_t p = count * es;
        const unsigned char kFill[4] = {0xef, 0xbe, 0xad, 0xde};
        EXPECT_EQ(static_cast<unsigned char*>(task.members[r].recv.data)[p], kFill[p % 4]) << "overrun";
      }
    }
  }

  void CheckReduceScatter(const ReduceSpec& spec, uint64_t count, bool in_place) {
    const DataType t = spec.dtype;
    const size_t es = DataTypeSize(t);
    const uint64_t total = count * n();
    Buffers b(n(), total * es, count * es);
    EngineTask task;
    task.collective = Collective::kReduceScatter;
    task.spec = spec;
    task.count = count;
    for (int r = 0; r < n(); ++r) {
      void* in = b.send[r].data();
      for (uint64_t i = 0; i < total; ++i) StoreAs(t, in, i, Input(t, r, i));
      AddRank(&task, in,
              in_place ? static_cast<void*>(static_cast<char*>(in) + r * count * es)
                                    : static_cast<void*>(b.recv[r].data()));
    }
    Run(task, total);
    int wrong = 0;
    for (int r = 0; r < n(); ++r) {
      for (uint64_t i = 0; i < count && wrong < 5; ++i) {
        const double want = Reference(spec, n(), uint64_t(r) * count + i);
        const double got = LoadAs(t, task.members[r].recv.data, i);
        if (!(std::fabs(got - want) <= Tol(spec, want))) {
          ++wrong;
          ADD_FAILURE() << "reduce-scatter " << DataTypeName(t) << " " << ReduceOpName(spec.op)
                        << " n=" << n() << " count=" << count << (in_place ? " in-place" : "")
                        << " rank " << r << " [" << i << "]: got " << got << ", want " << want;
        }
      }
    }
  }

  void CheckAllGather(DataType t, uint64_t count, bool in_place) {
    const size_t es = DataTypeSize(t);
    Buffers b(n(), count * es, count * n() * es);
    EngineTask task;
    task.collective = Collective::kAllGather;
    task.spec.dtype = t;
    task.count = count;
    for (int r = 0; r < n(); ++r) {
      void* out = b.recv[r].data();
      void* in = in_place ? static_cast<void*>(static_cast<char*>(out) + r * count * es)
                         : static_cast<void*>(b.send[r].data());
      for (uint64_t i = 0; i < count; ++i) StoreAs(t, in, i, Input(t, r, i));
      AddRank(&task, in,
              out);
    }
    Run(task, count * n());
    for (int r = 0; r < n(); ++r) {
      for (int j = 0; j < n(); ++j) {
        for (uint64_t i = 0; i < count; ++i) {
          ASSERT_EQ(LoadAs(t, task.members[r].recv.data, j * count + i), Input(t, j, i))
              << "all-gather " << DataTypeName(t) << " n=" << n() << " count=" << count
              << " rank " << r << " slice " << j << " [" << i << "]";
        }
      }
    }
  }

  void CheckBroadcast(DataType t, uint64_t count, int root, bool in_place) {
    const size_t es = DataTypeSize(t);
    Buffers b(n(), count * es, count * es);
    EngineTask task;
    task.collective = Collective::kBroadcast;
    task.spec.dtype = t;
    task.count = count;
    task.root = root;
    for (int r = 0; r < n(); ++r) {
      void* in = b.send[r].data();
      for (uint64_t i = 0; i < count; ++i) StoreAs(t, in, i, Input(t, r, i));
      AddRank(&task, in,
              in_place ? in : b.recv[r].data());
    }
    Run(task, count);
    for (int r = 0; r < n(); ++r) {
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(LoadAs(t, task.members[r].recv.data, i), Input(t, root, i))
            << "broadcast root " << root << " n=" << n() << " rank " << r << " [" << i << "]";
      }
    }
  }
};

std::vector<ReduceOp> OpsFor(DataType t) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                               ReduceOp::kProduct};
  if (IsFloatingPoint(t)) ops.push_back(ReduceOp::kPremulSum);
  return ops;
}

ReduceSpec Spec(DataType t, ReduceOp op) {
  ReduceSpec s;
  s.dtype = t;
  s.op = op;
  if (op == ReduceOp::kPremulSum) s.premul_factor = 0.25;
  return s;
}

TEST_P(CpuEngineCollectiveTest, AllReduceEveryDtypeAndOp) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : OpsFor(t)) {
      for (uint64_t count : {1, 7, 131}) {
        for (bool in_place : {false, true}) CheckAllReduce(Spec(t, op), count, in_place);
      }
    }
  }
}

TEST_P(CpuEngineCollectiveTest, ReduceScatterEveryDtypeAndOp) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : OpsFor(t)) {
      for (uint64_t count : {1, 5, 67}) {
        for (bool in_place : {false, true}) CheckReduceScatter(Spec(t, op), count, in_place);
      }
    }
  }
}

TEST_P(CpuEngineCollectiveTest, DivideFactorsAndReduceDtype) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                     DataType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum}) {
      ReduceSpec s = Spec(t, op);
      s.pre_divide = 2.0;
      s.post_divide = 4.0;
      CheckAllReduce(s, 33, false);
      CheckReduceScatter(s, 9, true);
      s.wire_dtype = DataType::kBFloat16;
      s.pre_divide = 1.0;
      s.post_divide = 3.0;  // not a power of two
      CheckAllReduce(s, 33, true);
      CheckReduceScatter(s, 9, false);
    }
  }
}

TEST_P(CpuEngineCollectiveTest, AllGather) {
  for (DataType t : kAllTypes) {
    for (uint64_t count : {1, 3, 129}) {
      for (bool in_place : {false, true}) CheckAllGather(t, count, in_place);
    }
  }
}

TEST_P(CpuEngineCollectiveTest, Broadcast) {
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64, DataType::kUInt8}) {
    for (int root = 0; root < n(); ++root) {
      CheckBroadcast(t, 13, root, false);
      CheckBroadcast(t, 13, root, true);
    }
  }
}

TEST_P(CpuEngineCollectiveTest, LargeOddCountsOnThePool) {
  // Several parallel chunks plus a ragged tail.
  CheckAllReduce(Spec(DataType::kFloat32, ReduceOp::kSum), 100003, false);
  CheckAllReduce(Spec(DataType::kBFloat16, ReduceOp::kAvg), 70001, true);
  CheckReduceScatter(Spec(DataType::kFloat32, ReduceOp::kMax), 65537, false);
  CheckReduceScatter(Spec(DataType::kFloat16, ReduceOp::kSum), 40001, true);
  CheckAllGather(DataType::kFloat32, 70001, true);
  CheckBroadcast(DataType::kInt32, 100001, n() - 1, false);
}

TEST_P(CpuEngineCollectiveTest, RunInSlicesEqualsTheReference) {
  // Slices that split the 64-element alignment and the parallel chunks.
  for (uint64_t slice : {1ull, 997ull, 70001ull}) {
    slice_ = slice;
    SCOPED_TRACE(slice);
    CheckAllReduce(Spec(DataType::kFloat32, ReduceOp::kSum), slice == 1 ? 301 : 100003, false);
    CheckAllReduce(Spec(DataType::kBFloat16, ReduceOp::kAvg), slice == 1 ? 129 : 70001, true);
    CheckReduceScatter(Spec(DataType::kFloat32, ReduceOp::kMax), slice == 1 ? 77 : 65537, false);
    CheckReduceScatter(Spec(DataType::kFloat16, ReduceOp::kSum), slice == 1 ? 65 : 40001, true);
    CheckAllGather(DataType::kFloat32, slice == 1 ? 99 : 70001, true);
    CheckAllGather(DataType::kInt64, slice == 1 ? 33 : 30011, false);
    CheckBroadcast(DataType::kInt32, slice == 1 ? 130 : 100001, n() - 1, false);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpuEngineCollectiveTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// --- the engine's queue ---

EngineTask SmallTask(Collective c, std::vector<float>* storage) {
  EngineTask t;
  t.collective = c;
  t.spec.dtype = DataType::kFloat32;
  t.count = 1;
  AddRank(&t, storage->data(), storage->data() + 1);
  t.priority = (c == Collective::kAllGather || c == Collective::kReduceScatter) ? 0 : 1;
  return t;
}

TEST(CpuEngineTest, InlineTasksCompleteBeforeSubmitReturns) {
  CpuEngine engine(2, /*inline_max_bytes=*/1024);
  std::vector<float> mem = {3.0f, 0.0f};
  bool done = false;
  Submit(&engine, SmallTask(Collective::kAllReduce, &mem), [&](absl::Status s, uint64_t) {
    EXPECT_TRUE(s.ok());
    done = true;
  });
  EXPECT_TRUE(done);
  EXPECT_EQ(mem[1], 3.0f);
}

TEST(CpuEngineTest, GatherAndScatterJumpAheadOfQueuedAllReduce) {
  CpuEngine engine(1, /*inline_max_bytes=*/0);  // everything goes through the queue
  std::vector<float> mem = {1.0f, 0.0f};
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  // A blocker whose callback holds the executor until the others are queued.
  Submit(&engine, SmallTask(Collective::kBroadcast, &mem), [&](absl::Status, uint64_t) {
    entered.set_value();
    released.wait();
  });
  entered.get_future().wait();
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const char* name) {
    return [&, name](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok());
      std::lock_guard<std::mutex> l(mu);
      order.push_back(name);
    };
  };
  Submit(&engine, SmallTask(Collective::kAllReduce, &mem), record("ar1"));
  Submit(&engine, SmallTask(Collective::kAllGather, &mem), record("ag"));
  Submit(&engine, SmallTask(Collective::kAllReduce, &mem), record("ar2"));
  Submit(&engine, SmallTask(Collective::kReduceScatter, &mem), record("rs"));
  release.set_value();
  engine.Shutdown();  // drains the queue
  EXPECT_EQ(order, (std::vector<std::string>{"ag", "rs", "ar1", "ar2"}));
}

TEST(CpuEngineTest, SubmitAfterShutdownFailsUnavailable) {
  CpuEngine engine(1, 0);
  engine.Shutdown();
  std::vector<float> mem = {1.0f, 0.0f};
  absl::Status got = absl::OkStatus();
  bool called = false;
  Submit(&engine, SmallTask(Collective::kAllReduce, &mem), [&](absl::Status s, uint64_t) {
    got = s;
    called = true;
  });
  EXPECT_TRUE(called);
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
}


// A float32 all-reduce of `count` elements over two ranks of `mem` (4 floats
// per element: in0, in1, out0, out1), queued (inline_max_bytes 0) as job `job`.
EngineTask BigAllReduce(std::vector<float>* mem, uint64_t count, const std::string& job,
                        int qos_class = 1) {
  mem->assign(4 * count, 0.0f);
  for (uint64_t i = 0; i < count; ++i) {
    (*mem)[i] = float(i % 7);
    (*mem)[count + i] = 1.0f;
  }
  EngineTask t;
  t.collective = Collective::kAllReduce;
  t.spec.dtype = DataType::kFloat32;
  t.count = count;
  t.job = job;
  t.qos_class = qos_class;
  AddRank(&t, mem->data(), mem->data() + 2 * count);
  AddRank(&t, mem->data() + count, mem->data() + 3 * count);
  return t;
}

void ExpectAllReduced(const std::vector<float>& mem, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_EQ(mem[2 * count + i], float(i % 7) + 1.0f) << i;
    ASSERT_EQ(mem[3 * count + i], float(i % 7) + 1.0f) << i;
  }
}

// Holds the executor in a queued task's completion until released, so that
// the tasks queued meanwhile are ordered by the queue alone.
struct Blocker {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<float> mem = {1.0f, 0.0f};
  explicit Blocker(CpuEngine* engine) {
    // The callback holds its own copy of the shared future: the engine
    // thread may still be inside wait() when the test ends and destroys this
    // Blocker (TSan saw the promise's state freed under it).
    Submit(engine, SmallTask(Collective::kBroadcast, &mem),
           [this, gate = released](absl::Status, uint64_t) {
             entered.set_value();
             gate.wait();
           });
    entered.get_future().wait();
  }
};

TEST(CpuEngineQosTest, AnotherJobsTaskRunsBetweenTheSlicesOfALargeOne) {
  // 64 slices of 64 KiB per rank: job b's task, queued behind job a's, ends
  // long before a's does, and both are right.
  CpuEngine engine(1, /*inline_max_bytes=*/0, /*slice_bytes=*/64 << 10);
  const uint64_t big = 64 * (64 << 10) / 4, small = 1024;
  std::vector<float> a_mem, b_mem;
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const char* name) {
    return [&, name](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> l(mu);
      order.push_back(name);
    };
  };
  {
    Blocker blocker(&engine);
    Submit(&engine, BigAllReduce(&a_mem, big, "a"), record("a"));
    Submit(&engine, BigAllReduce(&b_mem, small, "b"), record("b"));
    blocker.release.set_value();
  }
  engine.Shutdown();  // drains the queue
  EXPECT_EQ(order, (std::vector<std::string>{"b", "a"}));
  ExpectAllReduced(a_mem, big);
  ExpectAllReduced(b_mem, small);
}

TEST(CpuEngineQosTest, OneJobsLargeTaskDoesNotLetItsSecondGoAheadOfAnotherJob) {
  // Job a queues two large tasks, then job b one: b's runs before a's second
  // (in arrival order it would be last).
  CpuEngine engine(1, 0, /*slice_bytes=*/64 << 10);
  const uint64_t count = 4 * (64 << 10) / 4;
  std::vector<float> a1, a2, b1;
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const char* name) {
    return [&, name](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> l(mu);
      order.push_back(name);
    };
  };
  {
    Blocker blocker(&engine);
    Submit(&engine, BigAllReduce(&a1, count, "a"), record("a1"));
    Submit(&engine, BigAllReduce(&a2, count, "a"), record("a2"));
    Submit(&engine, BigAllReduce(&b1, count, "b"), record("b1"));
    blocker.release.set_value();
  }
  engine.Shutdown();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_LT(std::find(order.begin(), order.end(), "b1"),
            std::find(order.begin(), order.end(), "a2"));
  ExpectAllReduced(a1, count);
  ExpectAllReduced(a2, count);
  ExpectAllReduced(b1, count);
}

TEST(CpuEngineQosTest, SlicesShrinkWhileAnotherJobSharesTheEngine) {
  // 1 MiB slices. Job a alone: its 8 MiB-per-rank task runs in 8 slices.
  // Right after job b's task ran, a's next one starts in slices of 1/32 of
  // that (while the engine counts as shared): more slices, same result.
  CpuEngine engine(1, 0, /*slice_bytes=*/1 << 20);
  const uint64_t count = 8 * (1 << 20) / 4;
  std::vector<float> a_mem, b_mem;
  auto run = [&](EngineTask t) {
    std::promise<absl::Status> done;
    Submit(&engine, std::move(t), [&](absl::Status s, uint64_t) { done.set_value(s); });
    return done.get_future().get();
  };
  ASSERT_TRUE(run(BigAllReduce(&a_mem, count, "a")).ok());
  ExpectAllReduced(a_mem, count);
  EXPECT_EQ(engine.slices_run(), 8u);
  ASSERT_TRUE(run(BigAllReduce(&b_mem, 1024, "b")).ok());
  const uint64_t before = engine.slices_run();
  ASSERT_TRUE(run(BigAllReduce(&a_mem, count, "a")).ok());
  ExpectAllReduced(a_mem, count);
  EXPECT_GT(engine.slices_run() - before, 8u);
  engine.Shutdown();
}

TEST(CpuEngineQosTest, AHigherClassRunsFirst) {
  CpuEngine engine(1, 0, /*slice_bytes=*/64 << 10);
  const uint64_t count = 2 * (64 << 10) / 4;
  std::vector<float> low, high;
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](const char* name) {
    return [&, name](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> l(mu);
      order.push_back(name);
    };
  };
  {
    Blocker blocker(&engine);
    Submit(&engine, BigAllReduce(&low, count, "batch", /*qos_class=*/2), record("low"));
    Submit(&engine, BigAllReduce(&high, count, "urgent", /*qos_class=*/0), record("high"));
    blocker.release.set_value();
  }
  engine.Shutdown();
  EXPECT_EQ(order, (std::vector<std::string>{"high", "low"}));
}

TEST(CpuEngineQosTest, AnAbortEndsARunningTaskAtItsNextSlice) {
  // Job a's task (32 slices) starts; job b's small task runs after a's first
  // slice and, when it completes, aborts a: a ends ABORTED at its next slice
  // boundary, with only its first slice written.
  CpuEngine engine(1, 0, /*slice_bytes=*/64 << 10);
  const uint64_t count = 32 * (64 << 10) / 4, small = 1024;
  std::vector<float> a_mem, b_mem;
  std::promise<absl::Status> a_done;
  std::atomic<uint64_t> a_ticket{0};
  {
    Blocker blocker(&engine);
    EngineCallbacks cb;
    cb.launched = [](uint64_t) {};
    cb.completed = [&](absl::Status s, uint64_t) { a_done.set_value(s); };
    a_ticket = engine.Launch(BigAllReduce(&a_mem, count, "a"), std::move(cb));
    Submit(&engine, BigAllReduce(&b_mem, small, "b"), [&](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      engine.Abort(a_ticket.load(), absl::AbortedError("rank 1 left"));
    });
    blocker.release.set_value();
  }
  absl::Status s = a_done.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "rank 1 left");
  ExpectAllReduced(b_mem, small);
  const uint64_t slice = (64 << 10) / 4;
  EXPECT_EQ(a_mem[2 * count], 1.0f) << "the first slice ran";
  EXPECT_EQ(a_mem[2 * count + slice - 1], float((slice - 1) % 7) + 1.0f);
  EXPECT_EQ(a_mem[2 * count + slice], 0.0f) << "the second slice did not";
  EXPECT_EQ(a_mem[3 * count - 1], 0.0f);
}

// Scheduling policy of thread `tid` of this process (field 41 of its stat).
int PolicyOf(const std::string& tid) {
  std::ifstream f("/proc/self/task/" + tid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 41 && rest >> field; ++i) {
    if (i == 41) return std::stoi(field);
  }
  return -1;
}

// Ids of this process's threads named `name`.
std::vector<std::string> ThreadsNamed(const std::string& name) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == name) out.push_back(e.path().filename().string());
  }
  return out;
}

TEST(CpuEngineQosTest, ALowerClassComputesInIdleTimeWhileAHigherOneIsActive) {
  // Time is the engine's clock, moved 1 us by every read: the windows below
  // are counted in the engine's own reads, not in how fast this machine is.
  FakeClock clock(/*start_ns=*/1'000'000'000, /*step_per_read_ns=*/1'000);
  CpuEngine engine(2, /*inline_max_bytes=*/4096, /*slice_bytes=*/64 << 10, /*bulk_nice=*/0,
                   /*idle_lower_classes=*/true, &clock);
  if (!engine.idle_lower_classes()) GTEST_SKIP() << "this process cannot leave SCHED_IDLE";
  const uint64_t count = 16 * (64 << 10) / 4;  // 16 slices
  std::vector<float> low, high;
  auto run = [&](EngineTask t) {
    std::promise<int> done;
    Submit(&engine, std::move(t), [&](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      done.set_value(sched_getscheduler(0));  // on the executor, after the last slice
    });
    return done.get_future().get();
  };
  // Alone: no slice yields.
  EXPECT_EQ(run(BigAllReduce(&low, count, "batch", /*qos_class=*/6)), SCHED_OTHER);
  EXPECT_EQ(engine.idle_slices(), 0u);
  EXPECT_EQ(engine.yield_waits(), 0u);
  // A higher class's small (inline) op ran just now: each of the lower
  // class's 16 slices computes in SCHED_IDLE (a few reads each, far inside
  // the window), the first after waiting for the quiet gap, and the executor
  // is back in SCHED_OTHER before it reports (the completion takes locks
  // others share).
  run(BigAllReduce(&high, 16, "urgent", /*qos_class=*/1));
  const uint64_t before = engine.slices_run();
  EXPECT_EQ(run(BigAllReduce(&low, count, "batch", 6)), SCHED_OTHER);
  ExpectAllReduced(low, count);
  EXPECT_EQ(engine.slices_run() - before, 16u);
  EXPECT_EQ(engine.idle_slices(), 16u);
  EXPECT_EQ(engine.yield_waits(), 1u);
  // The same class, or a lower one, never makes a task yield.
  run(BigAllReduce(&high, 16, "other-batch", 6));
  run(BigAllReduce(&high, 16, "bulk", 7));
  clock.Advance(CpuEngine::kSharedWindowNs);  // class 1's window is over
  run(BigAllReduce(&low, count, "batch", 6));
  EXPECT_EQ(engine.idle_slices(), 16u);
  EXPECT_EQ(engine.yield_waits(), 1u);
  engine.Shutdown();
}

TEST(CpuEngineQosTest, ALowerClassWaitsInSchedIdleWhileAHigherOneKeepsLaunchingButIsNotStarved) {
  // The engine's clock moves 5 us with every read (the launches below, the
  // waiting slice's polls): the quiet gap (200 us) is 40 reads without a
  // launch, the bound on a wait (5 ms) 1000 reads, whatever the speed of
  // this machine or ThreadSanitizer's.
  FakeClock clock(/*start_ns=*/1'000'000'000, /*step_per_read_ns=*/5'000);
  CpuEngine engine(2, 4096, /*slice_bytes=*/64 << 10, 0, /*idle_lower_classes=*/true, &clock);
  if (!engine.idle_lower_classes()) GTEST_SKIP() << "this process cannot leave SCHED_IDLE";
  // Each thread names itself once running: wait (bounded) for both names.
  std::vector<std::string> engine_tids, pool_tids;
  testing::Eventually(
      [&] {
        engine_tids = ThreadsNamed("hsdp-engine");
        pool_tids = ThreadsNamed("hsdp-pool");
        return engine_tids.size() == 1 && pool_tids.size() == 1;
      },
      10000, /*poll_ms=*/1);
  ASSERT_EQ(engine_tids.size(), 1u);
  ASSERT_EQ(pool_tids.size(), 1u);
  EXPECT_EQ(PolicyOf(engine_tids[0]), SCHED_OTHER);
  // A low-class task of 16 slices while class 1 launches small ops without
  // a pause: its slices wait for a quiet gap that never comes, each at most
  // kMaxYieldNs, so it still ends; both engine threads are seen in
  // SCHED_IDLE meanwhile. "Without a pause" is still up to the scheduler:
  // this thread can be off its CPU for 40 of the waiting slice's polls
  // (2 ms), and a slice starting in such a gap rightly does not wait. So every attempt must end (no starvation) with the
  // threads back in SCHED_OTHER, and at least one of 30 attempts must show
  // the waits and both threads in SCHED_IDLE; an engine that never waits
  // fails all 30.
  const uint64_t count = 16 * (64 << 10) / 4;
  bool exercised = false;
  for (int attempt = 0; attempt < 30 && !exercised; ++attempt) {
    std::vector<float> low, high;
    std::atomic<bool> done{false};
    const uint64_t waits_before = engine.yield_waits();
    Submit(&engine, BigAllReduce(&high, 16, "urgent", 1), [](absl::Status, uint64_t) {});
    Submit(&engine, BigAllReduce(&low, count, "batch", 6), [&](absl::Status s, uint64_t) {
      EXPECT_TRUE(s.ok()) << s;
      done = true;
    });
    bool engine_idle = false, pool_idle = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done && std::chrono::steady_clock::now() < deadline) {
      Submit(&engine, BigAllReduce(&high, 16, "urgent", 1), [](absl::Status, uint64_t) {});
      engine_idle = engine_idle || PolicyOf(engine_tids[0]) == SCHED_IDLE;
      pool_idle = pool_idle || PolicyOf(pool_tids[0]) == SCHED_IDLE;
    }
    ASSERT_TRUE(done) << "the lower class was starved";
    // Back to normal before the completion was reported.
    EXPECT_EQ(PolicyOf(engine_tids[0]), SCHED_OTHER);
    EXPECT_EQ(PolicyOf(pool_tids[0]), SCHED_OTHER);
    ExpectAllReduced(low, count);
    exercised = engine.yield_waits() > waits_before && engine_idle && pool_idle;
  }
  engine.Shutdown();
  EXPECT_TRUE(exercised) << "in 30 attempts, the lower class's slices never waited for class 1 "
                            "with both engine threads seen in SCHED_IDLE";
}

}  // namespace
}  // namespace hsdp
