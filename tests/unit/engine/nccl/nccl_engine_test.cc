// NcclEngine against the fakes: results, group batching, stream choice,
// event ordering, reduce plans, all-to-all, failures (timeout, peer loss,
// abort) and new communicators for a new epoch.
#include "daemon/engine/nccl/nccl_engine.h"

#include <atomic>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"
#include "common/wait.h"

namespace hsdp::nccl {
namespace {

using testing::FakeNode;
using testing::Member;
using testing::Pending;
using testing::FloatTask;
using testing::MakeTask;

TEST(NcclEngineTest, AllReduceSumDrivesEveryLocalRankInOneGroupCall) {
  FakeNode node(3);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 3, 1000,
                          [](int r, uint64_t i) { return float(r + 1) * float(i % 7); });
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  auto out = p.Wait();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(out.launched);
  for (int r = 0; r < 3; ++r) {
    auto v = node.Read<float>(ft.recv[r], 1000);
    for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], 6.0f * float(i % 7)) << r << " " << i;
  }
  // One group call holding the three ranks' all-reduces.
  auto batches = node.coll.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 3u);
  std::set<int> ranks;
  for (const auto& c : batches[0]) {
    EXPECT_EQ(c.kind, "all_reduce");
    EXPECT_EQ(c.op.op, ReduceOp::kSum);
    ranks.insert(c.rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(node.engine.stats().comm_inits, 1u);
}

TEST(NcclEngineTest, ShardCollectivesUseHighPriorityStreamsAllReduceTheDefault) {
  FakeNode node(2);
  for (Collective c : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce}) {
    FloatTask ft = MakeTask(node, c, 2, 64, [](int r, uint64_t i) { return float(r * 100 + i); });
    Pending p;
    node.engine.Launch(ft.task, p.Callbacks());
    ASSERT_TRUE(p.Wait().status.ok());
  }
  auto calls = node.coll.calls();
  ASSERT_EQ(calls.size(), 6u);
  for (const auto& c : calls) {
    const bool shard = c.kind == "all_gather" || c.kind == "reduce_scatter";
    auto prio = node.dev.PriorityOf(c.stream);
    ASSERT_TRUE(prio.ok());
    EXPECT_EQ(*prio, shard ? device::StreamPriority::kHigh : device::StreamPriority::kDefault)
        << c.kind;
    EXPECT_EQ(c.stream, node.engine.StreamOf("g", c.rank, shard));
    EXPECT_EQ(*node.dev.DeviceOf(c.stream), c.rank);  // rank r lives on device r here
  }
}

// The job's class reaches the streams (docs/qos.md): above the default
// class every collective runs on the high-priority stream, below it none
// does; in the default class a latency-critical all-reduce does too.
TEST(NcclEngineTest, TheJobsClassChoosesTheStreamPriority) {
  struct Want {
    Collective c;
    int qos_class;
    int priority;
    device::StreamPriority stream;
  };
  const Want wants[] = {
      {Collective::kAllReduce, 1, 1, device::StreamPriority::kHigh},
      {Collective::kAllGather, 6, 0, device::StreamPriority::kDefault},
      {Collective::kReduceScatter, 6, 0, device::StreamPriority::kDefault},
      {Collective::kAllReduce, 4, -1, device::StreamPriority::kHigh},
      {Collective::kAllReduce, 4, 1, device::StreamPriority::kDefault},
  };
  for (const Want& w : wants) {
    FakeNode node(2);
    FloatTask ft = MakeTask(node, w.c, 2, 64, [](int r, uint64_t i) { return float(r + i); });
    ft.task.qos_class = w.qos_class;
    ft.task.priority = w.priority;
    Pending p;
    node.engine.Launch(ft.task, p.Callbacks());
    ASSERT_TRUE(p.Wait().status.ok());
    const auto calls = node.coll.calls();
    ASSERT_EQ(calls.size(), 2u);
    for (const auto& c : calls) {
      EXPECT_EQ(*node.dev.PriorityOf(c.stream), w.stream)
          << c.kind << " class " << w.qos_class << " priority " << w.priority;
    }
  }
}

TEST(NcclEngineTest, AllGatherAndReduceScatterResults) {
  FakeNode node(2);
  FloatTask ag = MakeTask(node, Collective::kAllGather, 2, 4,
                          [](int r, uint64_t i) { return float(10 * r + i); });
  Pending p1;
  node.engine.Launch(ag.task, p1.Callbacks());
  ASSERT_TRUE(p1.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ag.recv[1], 8), (std::vector<float>{0, 1, 2, 3, 10, 11, 12, 13}));
  FloatTask rs = MakeTask(node, Collective::kReduceScatter, 2, 2,
                          [](int r, uint64_t i) { return float(r + 1) * float(i); });
  Pending p2;
  node.engine.Launch(rs.task, p2.Callbacks());
  ASSERT_TRUE(p2.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(rs.recv[0], 2), (std::vector<float>{0, 3}));
  EXPECT_EQ(node.Read<float>(rs.recv[1], 2), (std::vector<float>{6, 9}));
}

TEST(NcclEngineTest, CollectiveNeverStartsBeforeTheProducerEvent) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 16, [](int, uint64_t) { return 0.0f; });
  // The "trainer" of rank 1 is still producing its input on its own stream.
  auto client_stream = node.dev.CreateStream(1, device::StreamPriority::kDefault);
  ASSERT_TRUE(client_stream.ok());
  std::promise<void> gate;
  auto gate_f = gate.get_future().share();
  ASSERT_TRUE(node.dev
                  .EnqueueHostFn(*client_stream,
                                 [&, gate_f]() {
                                   gate_f.wait();
                                   std::vector<float> v(16, 5.0f);  // the producer writes its input
                                   return node.dev.CopyToDevice(ft.send[1], v.data(), 64);
                                 })
                  .ok());
  auto produced = node.dev.CreateEvent(1, true);
  ASSERT_TRUE(produced.ok());
  ASSERT_TRUE(node.dev.RecordEvent(*produced, *client_stream).ok());
  // The daemon opens the exported event, as it would from another process.
  auto handle = node.dev.ExportEvent(*produced);
  ASSERT_TRUE(handle.ok());
  auto imported = node.dev.ImportEvent(1, *handle);
  ASSERT_TRUE(imported.ok());
  ft.task.members[1].wait_event = *imported;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  // Launched (ordered) but held by the device, not by a CPU wait.
  EXPECT_FALSE(p.Ready(100));
  EXPECT_EQ(node.Read<float>(ft.recv[0], 1)[0], -1.0f);  // nothing written yet
  gate.set_value();
  ASSERT_TRUE(p.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ft.recv[0], 16), std::vector<float>(16, 5.0f));
  node.dev.DestroyEvent(*imported);
}

TEST(NcclEngineTest, ClientStreamWaitsOnTheCompletionEvent) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 8, [](int r, uint64_t) { return r + 1.0f; });
  auto done = node.dev.CreateEvent(0, true);
  ASSERT_TRUE(done.ok());
  ft.task.members[0].done_event = *done;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  // The trainer's stream waits on the event, then consumes the output.
  auto client = node.dev.CreateStream(0, device::StreamPriority::kDefault);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(p.Wait().status.ok());  // completion is recorded before `completed`
  ASSERT_TRUE(node.dev.StreamWaitEvent(*client, *done).ok());
  std::atomic<float> seen{0};
  ASSERT_TRUE(node.dev
                  .EnqueueHostFn(*client,
                                 [&]() {
                                   float v;
                                   auto s = node.dev.CopyToHost(&v, ft.recv[0], 4);
                                   seen = v;
                                   return s;
                                 })
                  .ok());
  node.dev.SyncStream(*client);
  EXPECT_EQ(seen.load(), 3.0f);
  auto ev_done = node.dev.EventDone(*done);
  ASSERT_TRUE(ev_done.ok());
  EXPECT_TRUE(*ev_done);
}

TEST(NcclEngineTest, PreAndPostDivideUsePreMulSumAndAnInPlaceScale) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t i) { return 8.0f * (i + 1); });
  ft.task.spec.op = ReduceOp::kAvg;
  ft.task.spec.pre_divide = 2;
  ft.task.spec.post_divide = 1;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  // As on the CPU: y = sum(x / pre) / (post * n) = x / 2 for equal inputs.
  EXPECT_EQ(node.Read<float>(ft.recv[1], 4), (std::vector<float>{4, 8, 12, 16}));
  auto calls = node.coll.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].op.op, ReduceOp::kPremulSum);
  EXPECT_DOUBLE_EQ(calls[0].premul, 0.5);
  EXPECT_EQ(node.coll.premul_ops_live(), 0);  // destroyed once issued
}

TEST(NcclEngineTest, PlainAvgUsesNcclAvg) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 4, [](int r, uint64_t) { return 2.0f * r; });
  ft.task.spec.op = ReduceOp::kAvg;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ft.recv[0], 4), std::vector<float>(4, 1.0f));
  EXPECT_EQ(node.coll.calls()[0].op.op, ReduceOp::kAvg);
}

TEST(NcclEngineTest, ReduceDtypeRunsTheCollectiveInTheWireTypeWithFusedScaling) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kReduceScatter, 2, 3,
                          [](int r, uint64_t i) { return float(4 * (r + 1)) + float(i); });
  ft.task.spec.wire_dtype = DataType::kBFloat16;
  ft.task.spec.pre_divide = 2;
  ft.task.spec.post_divide = 2;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  // rank 0 gets elements 0..2: ((4+i)/2 + (8+i)/2) / 2
  EXPECT_EQ(node.Read<float>(ft.recv[0], 3), (std::vector<float>{3, 3.5, 4}));
  EXPECT_EQ(node.Read<float>(ft.recv[1], 3), (std::vector<float>{4.5, 5, 5.5}));
  for (const auto& c : node.coll.calls()) {
    EXPECT_EQ(c.dtype, DataType::kBFloat16);
    EXPECT_EQ(c.op.op, ReduceOp::kSum);  // the 1/pre rides in the cast-in kernel
  }
}

TEST(NcclEngineTest, CompositePhaseTwoRunsAfterPhaseOne) {
  FakeNode node(2);
  // Phase 1: reduce-scatter in the shard group (held back by a producer event).
  FloatTask rs = MakeTask(node, Collective::kReduceScatter, 2, 2,
                          [](int r, uint64_t i) { return float(r + 1 + i); }, "shard");
  auto client = node.dev.CreateStream(0, device::StreamPriority::kDefault);
  std::promise<void> gate;
  auto gate_f = gate.get_future().share();
  ASSERT_TRUE(node.dev.EnqueueHostFn(*client, [gate_f]() { gate_f.wait(); return absl::OkStatus(); }).ok());
  auto ev = node.dev.CreateEvent(0, true);
  ASSERT_TRUE(node.dev.RecordEvent(*ev, *client).ok());
  rs.task.members[0].wait_event = *ev;
  Pending p1;
  const uint64_t t1 = node.engine.Launch(rs.task, p1.Callbacks());
  // Phase 2: all-reduce of each rank's shard in the replicate group, in place.
  EngineTask ar;
  ar.collective = Collective::kAllReduce;
  ar.count = 2;
  ar.group_key = "replicate";
  ar.spec.dtype = DataType::kFloat32;
  ar.depends_on = {t1};
  for (int r = 0; r < 2; ++r) ar.members.push_back(Member(r, r, rs.recv[r], rs.recv[r], 8, 8));
  Pending p2;
  node.engine.Launch(ar, p2.Callbacks());
  EXPECT_FALSE(p2.Ready(100));
  EXPECT_FALSE(p1.Ready(0));
  gate.set_value();
  ASSERT_TRUE(p1.Wait().status.ok());
  ASSERT_TRUE(p2.Wait().status.ok());
  // RS: rank0 {1+2, 2+3} = {3,5}, rank1 {3+4, 4+5} = {7,9}; AR: {10, 14} on both.
  EXPECT_EQ(node.Read<float>(rs.recv[0], 2), (std::vector<float>{10, 14}));
  EXPECT_EQ(node.Read<float>(rs.recv[1], 2), (std::vector<float>{10, 14}));
  // Two different communicator sets, both initialised.
  EXPECT_EQ(node.engine.stats().comm_inits, 2u);
}

TEST(NcclEngineTest, FailedDependencyFailsTheDependent) {
  FakeNode node(2);
  EngineTask bad = MakeTask(node, Collective::kAllReduce, 2, 2, [](int, uint64_t) { return 1.0f; }).task;
  bad.members[1].send.kind = MemoryKind::kHost;  // refused up front
  Pending p1;
  const uint64_t t1 = node.engine.Launch(bad, p1.Callbacks());
  ASSERT_FALSE(p1.Wait().status.ok());
  FloatTask dep = MakeTask(node, Collective::kAllReduce, 2, 2, [](int, uint64_t) { return 1.0f; });
  dep.task.depends_on = {t1};
  Pending p2;
  node.engine.Launch(dep.task, p2.Callbacks());
  auto out = p2.Wait();
  EXPECT_FALSE(out.status.ok());
  EXPECT_NE(out.status.message().find("depends on failed"), std::string::npos) << out.status;
}

TEST(NcclEngineTest, AllToAllIsSendRecvPairsInOneGroupCall) {
  FakeNode node(3);
  FloatTask ft = MakeTask(node, Collective::kAllToAll, 3, 2,
                          [](int r, uint64_t i) { return float(100 * r + i); });
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  // Member 1 receives block 1 of every member: {100*j + 2, 100*j + 3}.
  EXPECT_EQ(node.Read<float>(ft.recv[1], 6), (std::vector<float>{2, 3, 102, 103, 202, 203}));
  auto batches = node.coll.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].size(), 18u);  // 3 ranks x 3 peers x (send + recv)
}

TEST(NcclEngineTest, UnevenAllToAll) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllToAll, 2, 2, [](int r, uint64_t i) { return float(10 * r + i); });
  // Rank 0 sends 1 to itself and 3 to rank 1; rank 1 sends 1 and 1.
  ft.task.members[0].send_counts = {1, 3};
  ft.task.members[0].recv_counts = {1, 1};
  ft.task.members[1].send_counts = {1, 1};
  ft.task.members[1].recv_counts = {3, 1};
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ft.recv[0], 2), (std::vector<float>{0, 10}));
  EXPECT_EQ(node.Read<float>(ft.recv[1], 4), (std::vector<float>{1, 2, 3, 11}));
}

TEST(NcclEngineTest, BroadcastFromRoot) {
  FakeNode node(3);
  FloatTask ft = MakeTask(node, Collective::kBroadcast, 3, 3, [](int r, uint64_t i) { return float(r * 10 + i); });
  ft.task.root = 2;
  Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  ASSERT_TRUE(p.Wait().status.ok());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(node.Read<float>(ft.recv[r], 3), (std::vector<float>{20, 21, 22}));
}

TEST(NcclEngineTest, TimeoutAbortsTheCommunicatorsAndFailsEveryOpInFlight) {
  NcclEngineOptions o = FakeNode::FastOptions();
  o.op_timeout = absl::Milliseconds(200);
  FakeNode node(2, o);
  node.coll.Stall(true);  // a peer that never shows up
  FloatTask a = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  FloatTask b = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending pa, pb;
  node.engine.Launch(a.task, pa.Callbacks());
  node.engine.Launch(b.task, pb.Callbacks());
  auto oa = pa.Wait();
  auto ob = pb.Wait();
  EXPECT_EQ(oa.status.code(), absl::StatusCode::kDeadlineExceeded) << oa.status;
  EXPECT_EQ(ob.status.code(), absl::StatusCode::kDeadlineExceeded) << ob.status;
  EXPECT_NE(oa.status.message().find("aborted"), std::string::npos);
  EXPECT_EQ(node.coll.aborted_comms(), 2);
  EXPECT_EQ(node.engine.stats().comm_aborts, 1u);
  // The epoch is over: the next op of it fails at once.
  node.coll.Stall(false);
  FloatTask c = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending pc;
  node.engine.Launch(c.task, pc.Callbacks());
  auto oc = pc.Wait();
  EXPECT_NE(oc.status.message().find("failed earlier"), std::string::npos) << oc.status;
  // A new epoch gets new communicators and works.
  EngineGroupSpec spec;
  spec.key = "g";
  spec.epoch = 2;
  spec.ranks = {0, 1};
  ASSERT_TRUE(node.engine.CreateGroup(spec).ok());
  FloatTask d = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; }, "g", 2);
  Pending pd;
  node.engine.Launch(d.task, pd.Callbacks());
  ASSERT_TRUE(pd.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(d.recv[0], 4), std::vector<float>(4, 2.0f));
  EXPECT_EQ(node.engine.stats().comm_inits, 2u);
}

TEST(NcclEngineTest, AsyncCommunicatorErrorFailsTheOpsInFlight) {
  FakeNode node(2);
  node.coll.Stall(true);
  FloatTask a = MakeTask(node, Collective::kAllGather, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending pa;
  node.engine.Launch(a.task, pa.Callbacks());
  // Wait until the collective was issued, then a peer is lost.
  ASSERT_EQ(hsdp::testing::EventuallyEq([&] { return node.coll.calls().size(); }, size_t{2}, 2000, 1),
            2u);
  node.coll.FailAsync(node.coll.calls()[0].comm, absl::UnavailableError("remote process exited"));
  auto oa = pa.Wait();
  EXPECT_EQ(oa.status.code(), absl::StatusCode::kUnavailable) << oa.status;
  EXPECT_NE(oa.status.message().find("remote process exited"), std::string::npos);
  EXPECT_EQ(node.coll.live_comms(), 0);
}

TEST(NcclEngineTest, AbortOfARunningTaskAbortsItsCommunicators) {
  FakeNode node(2);
  node.coll.Stall(true);
  FloatTask a = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending pa;
  const uint64_t t = node.engine.Launch(a.task, pa.Callbacks());
  // Running: both ranks' collectives were issued (and stall).
  ASSERT_TRUE(hsdp::testing::Eventually([&] { return node.coll.calls().size() >= 2; }, 2000, 1));
  node.engine.Abort(t, absl::AbortedError("member rank 1 left"));
  auto oa = pa.Wait();
  EXPECT_EQ(oa.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(node.coll.aborted_comms(), 2);
}

TEST(NcclEngineTest, SurvivorsOfAHealthyEpochGetShrunkCommunicators) {
  FakeNode node(3);
  FloatTask a = MakeTask(node, Collective::kAllReduce, 3, 2, [](int, uint64_t) { return 1.0f; });
  Pending pa;
  node.engine.Launch(a.task, pa.Callbacks());
  ASSERT_TRUE(pa.Wait().status.ok());
  EngineGroupSpec spec;
  spec.key = "g";
  spec.epoch = 2;
  spec.ranks = {0, 2};
  ASSERT_TRUE(node.engine.CreateGroup(spec).ok());
  // Ranks 0 and 2 (devices 0 and 2) remain.
  FloatTask b = MakeTask(node, Collective::kAllReduce, 3, 2, [](int r, uint64_t) { return r + 1.0f; }, "g", 2);
  b.task.members.erase(b.task.members.begin() + 1);
  Pending pb;
  node.engine.Launch(b.task, pb.Callbacks());
  ASSERT_TRUE(pb.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(b.recv[2], 2), std::vector<float>(2, 4.0f));
  EXPECT_EQ(node.engine.stats().comm_shrinks, 1u);
  EXPECT_EQ(node.engine.stats().comm_inits, 1u);
}

TEST(NcclEngineTest, WithoutShrinkSurvivorsGetAFreshInit) {
  FakeNode node(3, FakeNode::FastOptions(), /*shrink=*/false);
  FloatTask a = MakeTask(node, Collective::kAllReduce, 3, 2, [](int, uint64_t) { return 1.0f; });
  Pending pa;
  node.engine.Launch(a.task, pa.Callbacks());
  ASSERT_TRUE(pa.Wait().status.ok());
  FloatTask b = MakeTask(node, Collective::kAllReduce, 3, 2, [](int, uint64_t) { return 1.0f; }, "g", 2);
  b.task.members.pop_back();
  Pending pb;
  node.engine.Launch(b.task, pb.Callbacks());
  ASSERT_TRUE(pb.Wait().status.ok());
  EXPECT_EQ(node.engine.stats().comm_shrinks, 0u);
  EXPECT_EQ(node.engine.stats().comm_inits, 2u);
}

TEST(NcclEngineTest, RefusesWhatItCannotRun) {
  FakeNode node(2);
  auto refused = [&](EngineTask t) {
    Pending p;
    node.engine.Launch(std::move(t), p.Callbacks());
    return p.Wait().status;
  };
  FloatTask base = MakeTask(node, Collective::kAllReduce, 2, 2, [](int, uint64_t) { return 1.0f; });
  EngineTask host = base.task;
  host.members[0].recv.kind = MemoryKind::kHost;
  EXPECT_EQ(refused(host).code(), absl::StatusCode::kInvalidArgument);
  EngineTask missing = base.task;
  missing.members[1].send.device = missing.members[1].recv.device = 7;
  EXPECT_EQ(refused(missing).code(), absl::StatusCode::kInvalidArgument);
  EngineTask remote = base.task;
  remote.members[1].local = false;
  EXPECT_EQ(refused(remote).code(), absl::StatusCode::kUnimplemented);
  EngineTask intavg = base.task;
  intavg.spec.dtype = DataType::kInt32;
  intavg.spec.op = ReduceOp::kAvg;
  EXPECT_EQ(refused(intavg).code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(node.coll.calls().empty());
}

TEST(NcclEngineTest, ShutdownFinishesQueuedWorkAndReleasesEverything) {
  auto node = std::make_unique<FakeNode>(2);
  std::vector<Pending> ps(5);
  std::vector<FloatTask> ts;
  for (int i = 0; i < 5; ++i) {
    ts.push_back(MakeTask(*node, Collective::kAllReduce, 2, 64, [](int, uint64_t) { return 1.0f; }));
    node->engine.Launch(ts.back().task, ps[i].Callbacks());
  }
  node->engine.Shutdown();
  for (auto& p : ps) EXPECT_TRUE(p.Wait().status.ok());
  EXPECT_EQ(node->coll.live_comms(), 0);
  EXPECT_EQ(node->dev.live_streams(), 0);
  Pending late;
  node->engine.Launch(ts[0].task, late.Callbacks());
  EXPECT_EQ(late.Wait().status.code(), absl::StatusCode::kUnavailable);
}

TEST(NcclEngineTest, TasksOfOneGroupOnTwoStreamsRunInLaunchOrder) {
  FakeNode node(2);
  // An all-gather (high-priority stream) held back by its producer, then an
  // all-reduce of the same group (default stream): it must wait for it.
  FloatTask ag = MakeTask(node, Collective::kAllGather, 2, 4, [](int r, uint64_t) { return r + 1.0f; });
  auto client = node.dev.CreateStream(0, device::StreamPriority::kDefault);
  std::promise<void> gate;
  auto gate_f = gate.get_future().share();
  ASSERT_TRUE(node.dev.EnqueueHostFn(*client, [gate_f]() { gate_f.wait(); return absl::OkStatus(); }).ok());
  auto ev = node.dev.CreateEvent(0, true);
  ASSERT_TRUE(node.dev.RecordEvent(*ev, *client).ok());
  ag.task.members[0].wait_event = *ev;
  Pending p1;
  node.engine.Launch(ag.task, p1.Callbacks());
  FloatTask ar = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending p2;
  node.engine.Launch(ar.task, p2.Callbacks());
  EXPECT_FALSE(p2.Ready(100));
  EXPECT_EQ(node.Read<float>(ar.recv[0], 1)[0], -1.0f);
  gate.set_value();
  ASSERT_TRUE(p1.Wait().status.ok());
  ASSERT_TRUE(p2.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ar.recv[0], 4), std::vector<float>(4, 2.0f));
}

TEST(NcclEngineTest, ShutdownAbortsWhatIsStillRunningAfterTheGracePeriod) {
  NcclEngineOptions o = FakeNode::FastOptions();
  o.shutdown_grace = absl::Milliseconds(100);
  FakeNode node(2, o);
  node.coll.Stall(true);
  FloatTask a = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  Pending pa;
  node.engine.Launch(a.task, pa.Callbacks());
  ASSERT_TRUE(hsdp::testing::Eventually([&] { return node.coll.calls().size() >= 2; }, 2000, 1));
  node.engine.Shutdown();  // returns after the grace period, not after op_timeout (30 s)
  auto oa = pa.Wait();
  EXPECT_EQ(oa.status.code(), absl::StatusCode::kUnavailable) << oa.status;
  EXPECT_EQ(node.coll.live_comms(), 0);
}

TEST(NcclEngineTest, AProducerThatNeverFinishesDoesNotBlockTheDeviceAfterTheTimeout) {
  NcclEngineOptions o = FakeNode::FastOptions();
  o.op_timeout = absl::Milliseconds(150);
  FakeNode node(2, o);
  // Rank 1's trainer records its producer event behind work that never ends.
  auto client = node.dev.CreateStream(1, device::StreamPriority::kDefault);
  std::promise<void> never;
  auto never_f = never.get_future().share();
  ASSERT_TRUE(node.dev.EnqueueHostFn(*client, [never_f]() { never_f.wait(); return absl::OkStatus(); }).ok());
  auto ev = node.dev.CreateEvent(1, true);
  ASSERT_TRUE(node.dev.RecordEvent(*ev, *client).ok());
  FloatTask stuck = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 1.0f; });
  stuck.task.members[1].wait_event = *ev;
  Pending p1;
  node.engine.Launch(stuck.task, p1.Callbacks());
  EXPECT_EQ(p1.Wait().status.code(), absl::StatusCode::kDeadlineExceeded);
  const device::StreamHandle old_stream = node.engine.StreamOf("g", 1, false);
  // The group is re-formed; its next op must run, on fresh streams.
  FloatTask next = MakeTask(node, Collective::kAllReduce, 2, 4, [](int, uint64_t) { return 2.0f; }, "g", 2);
  Pending p2;
  node.engine.Launch(next.task, p2.Callbacks());
  ASSERT_TRUE(p2.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(next.recv[1], 4), std::vector<float>(4, 4.0f));
  EXPECT_NE(node.engine.StreamOf("g", 1, false), old_stream);
  node.engine.Shutdown();  // the abandoned stream is released without waiting
  never.set_value();
}

}  // namespace
}  // namespace hsdp::nccl
