// An abort while a task's work would wait behind a
// trainer's producer event. The fake device runs a destroyed stream's queued
// work late (when the event fires, as a GPU does) and faults on a kernel that
// touches freed memory or a released communicator, so work left queued
// behind the event shows up as a fault after the task completed and its
// buffers were freed.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"
#include "common/wait.h"

namespace hsdp::nccl {
namespace {

using testing::FakeNode;
using testing::FloatTask;
using testing::MakeTask;

// A trainer's producer: work on its own stream held by a gate, then an
// interprocess event the daemon imports.
struct Producer {
  explicit Producer(FakeNode& node, int device) : node(node) {
    stream = *node.dev.CreateStream(device, device::StreamPriority::kDefault);
    auto f = gate.get_future().share();
    EXPECT_TRUE(node.dev.EnqueueHostFn(stream, [f] { f.wait(); return absl::OkStatus(); }).ok());
    event = *node.dev.CreateEvent(device, true);
    EXPECT_TRUE(node.dev.RecordEvent(event, stream).ok());
    imported = *node.dev.ImportEvent(device, *node.dev.ExportEvent(event));
  }
  ~Producer() { Open(); }
  void Open() {
    if (!opened.exchange(true)) gate.set_value();
    node.dev.SyncStream(stream);
  }
  FakeNode& node;
  device::StreamHandle stream = 0;
  device::EventHandle event = 0, imported = 0;
  std::promise<void> gate;
  std::atomic<bool> opened{false};
};

TEST(NcclAbortTest, AnAbortedTaskLeavesNothingQueuedBehindAProducerEvent) {
  FakeNode node(2);
  node.coll.set_release_bound(std::chrono::milliseconds(200));
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 64, [](int, uint64_t) { return 1.0f; });
  ft.task.spec.post_divide = 2.0;  // an in-place scale kernel after the collective
  Producer producer(node, 1);
  ft.task.members[1].wait_event = producer.imported;
  // The session's side: when the operation completes, its buffers are
  // unmapped (here: freed).
  std::promise<absl::Status> done;
  EngineCallbacks cb;
  cb.launched = [](uint64_t) {};
  cb.completed = [&](absl::Status s, uint64_t) {
    for (device::DevicePtr p : ft.send) EXPECT_TRUE(node.dev.Free(p).ok());
    for (device::DevicePtr p : ft.recv) EXPECT_TRUE(node.dev.Free(p).ok());
    done.set_value(std::move(s));
  };
  const uint64_t ticket = node.engine.Launch(ft.task, std::move(cb));
  // Give an engine that enqueues at once the chance to do so (bounded).
  for (int i = 0; i < 200 && node.coll.calls().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  node.engine.Abort(ticket, absl::AbortedError("the trainer of rank 1 left"));
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get().code(), absl::StatusCode::kAborted);
  // The producer finally finishes; whatever was queued behind it runs now.
  producer.Open();
  node.engine.Shutdown();  // waits (bounded) for the markers behind released streams
  EXPECT_EQ(node.dev.faults(), 0) << node.dev.first_fault();
  EXPECT_TRUE(node.coll.calls().empty()) << "nothing is issued before the producer is done";
}

// A dependent (the composite's second phase) is aborted while what it depends
// on is stuck (a lost peer in another group). Nothing of it may be queued
// behind the stuck work: NCCL's abort of its communicators would wait for
// that work (its free's device synchronisation) — with the engine thread,
// which alone could abort the stuck set, blocked in it — and the queued
// kernels would start once the stuck work ends, on freed communicators.
TEST(NcclAbortTest, ADependentAbortedWhileItsDependencyIsStuckLeavesNothingQueued) {
  FakeNode node(2);
  node.coll.set_release_bound(std::chrono::milliseconds(200));
  FloatTask first = MakeTask(node, Collective::kAllReduce, 2, 8, [](int, uint64_t) { return 1.0f; }, "shard");
  node.coll.Stall(true);
  testing::Pending p1, p2;
  const uint64_t t1 = node.engine.Launch(first.task, p1.Callbacks());
  ASSERT_EQ(hsdp::testing::EventuallyEq([&] { return node.coll.calls().size(); }, size_t{2}, 2000, 1),
            2u);
  node.coll.Stall(false);
  EngineTask second;
  second.collective = Collective::kAllReduce;
  second.count = 8;
  second.group_key = "replicate";
  second.spec.dtype = DataType::kFloat32;
  second.depends_on = {t1};
  for (int r = 0; r < 2; ++r) {
    second.members.push_back(testing::Member(r, r, first.recv[r], first.recv[r], 32, 32));
  }
  const uint64_t t2 = node.engine.Launch(second, p2.Callbacks());
  for (int i = 0; i < 200 && node.coll.calls().size() < 4; ++i) {  // an eager engine issues it
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  node.engine.Abort(t2, absl::AbortedError("a trainer left"));
  EXPECT_EQ(p2.Wait().status.code(), absl::StatusCode::kAborted);
  node.engine.Abort(t1, absl::AbortedError("the lost peer"));
  EXPECT_EQ(p1.Wait().status.code(), absl::StatusCode::kAborted);
  node.engine.Shutdown();
  EXPECT_EQ(node.dev.faults(), 0) << node.dev.first_fault();
  EXPECT_EQ(node.coll.calls().size(), 2u) << "the dependent was never issued";
}

// A producer event that completes lets the task through; its data is read.
TEST(NcclAbortTest, ATaskLeavesTheGateWhenItsProducerCompletes) {
  FakeNode node(2);
  FloatTask ft = MakeTask(node, Collective::kAllReduce, 2, 8, [](int, uint64_t) { return 1.0f; });
  Producer producer(node, 1);
  ft.task.members[1].wait_event = producer.imported;
  testing::Pending p;
  node.engine.Launch(ft.task, p.Callbacks());
  EXPECT_FALSE(p.Ready(50));
  producer.Open();
  ASSERT_TRUE(p.Wait().status.ok());
  EXPECT_EQ(node.Read<float>(ft.recv[0], 8), std::vector<float>(8, 2.0f));
  EXPECT_EQ(node.dev.faults(), 0);
}

// A task waiting at the gate keeps its group's later tasks behind it (launch
// order), while another group's task runs.
TEST(NcclAbortTest, TheGateKeepsLaunchOrderPerGroupOnly) {
  FakeNode node(2);
  FloatTask first = MakeTask(node, Collective::kAllReduce, 2, 8, [](int, uint64_t) { return 1.0f; });
  FloatTask second = MakeTask(node, Collective::kAllReduce, 2, 8, [](int, uint64_t) { return 2.0f; });
  FloatTask other = MakeTask(node, Collective::kAllReduce, 2, 8, [](int, uint64_t) { return 3.0f; }, "h");
  Producer producer(node, 0);
  first.task.members[0].wait_event = producer.imported;
  testing::Pending p1, p2, p3;
  node.engine.Launch(first.task, p1.Callbacks());
  node.engine.Launch(second.task, p2.Callbacks());
  node.engine.Launch(other.task, p3.Callbacks());
  ASSERT_TRUE(p3.Wait().status.ok());  // group h is not held back
  // g's first waits for its producer, its second behind it: both in the gate.
  EXPECT_EQ(hsdp::testing::EventuallyEq([&] { return node.engine.stats().gated_tasks; },
                                        uint64_t{2}, 5000, 1),
            2u);
  EXPECT_FALSE(p2.Ready(0));
  EXPECT_FALSE(p1.Ready(0));
  producer.Open();
  ASSERT_TRUE(p1.Wait().status.ok());
  ASSERT_TRUE(p2.Wait().status.ok());
  EXPECT_EQ(hsdp::testing::EventuallyEq([&] { return node.engine.stats().gated_tasks; },
                                        uint64_t{0}, 5000, 1),
            0u);
  auto calls = node.coll.calls();
  ASSERT_EQ(calls.size(), 6u);  // h, then g's first, then g's second
  EXPECT_EQ(node.Read<float>(second.recv[1], 8), std::vector<float>(8, 4.0f));
}

}  // namespace
}  // namespace hsdp::nccl
