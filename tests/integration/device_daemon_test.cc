// Device-memory collectives end to end through a real hsdpd on the fake
// device (engine.device: fake): trainer processes own their "device memory"
// (memfds / named shm objects, both handle kinds), register it through the
// C++ client, and the daemon runs its NCCL engine (fake NCCL) on it. Checks
// every collective and the HSDP composite against an independent
// reference, producer-event ordering (asserted on data), completion events,
// a freed-and-reused handle never hitting a stale mapping, a killed trainer
// leaking nothing, and CPU tensors on the same daemon.
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "device_fake_util.h"
#include "device_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp {
namespace {

using testing::Await;
using testing::CheckEveryCollective2;
using testing::CheckHsdpComposite2x2;
using testing::Child;
using testing::DaemonProcess;
using testing::DeviceTrainer;
using testing::Expect;
using testing::FakeDeviceConfig;
using testing::FakeTrainerDevice;
using ::testing::HasSubstr;
using testing::In;
using testing::RunRanks;
using testing::TempDir;

constexpr uint64_t kCount = 1000;                // elements per rank
constexpr uint64_t kRecvOffset = 64 * 1024;      // recv region in the allocation
constexpr uint64_t kAllocBytes = 256 * 1024;

// All-reduce (out of place and in place, sum and max), all-gather,
// reduce-scatter, broadcast and all-to-all on device buffers of 2 ranks.
TEST(DeviceDaemonTest, EveryCollectiveOnDeviceBuffersMatchesTheReference) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  // The socket accepts connections from early in the start; the line that
  // names the fake device comes at its end.
  EXPECT_TRUE(testing::Eventually([&] { return d.Log().find("TEST ONLY") != std::string::npos; },
                                  10000))
      << d.Log();
  constexpr int kWorld = 2;
  RunRanks(kWorld, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "coll", rank, kWorld, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    if (!g.ok()) return T.Fail("NewGroup"), 1;
    CheckEveryCollective2(&T, *g, kCount, kRecvOffset, {ReduceOp::kSum, ReduceOp::kMax});
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  }, 120000);
  EXPECT_TRUE(d.Alive()) << d.Log();
  EXPECT_EQ(d.Stop(), 0);
}

// The HSDP composite (reduce-scatter in the shard group, all-reduce across
// the replicate group) on a 2x2 mesh of device buffers.
TEST(DeviceDaemonTest, HsdpCompositeOn2x2MeshOfDeviceBuffers) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(4, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "mesh", rank, 4, kAllocBytes)) return 1;
    if (!CheckHsdpComposite2x2(&T, kCount, kRecvOffset)) return 1;
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  }, 120000);
  EXPECT_EQ(d.Stop(), 0);
}

// A producer event held back: the collective must not read the buffer
// before the producer is released. The trainer records the event, submits,
// and only then writes the real data and releases the event: the result
// shows which data the daemon read. Then the completion event: the daemon
// recorded it, and WaitOnStream hands its id to the stream-wait callback.
TEST(DeviceDaemonTest, ProducerEventOrdersTheCollectiveAndCompletionEventsAreRecorded) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "order", rank, 2, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    auto producer = T.dev.CreateEvent();
    if (!g.ok() || !producer.ok()) return T.Fail("setup"), 1;
    const auto& h = (*producer)->shared->handle();
    auto ev = T.client->RegisterDeviceEvent(T.device,
                                            std::string(reinterpret_cast<const char*>(h.data()),
                                                        h.size()));
    if (!ev.ok()) return T.Fail("RegisterDeviceEvent: " + ev.status().ToString()), 1;
    for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = -1.0f;  // stale data
    (*producer)->Record();  // the producer "kernel" is now pending
    SubmitOptions so;
    so.wait_event_id = *ev;
    auto w = T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                 DataType::kFloat32, {}, so);
    if (!w.ok()) return T.Fail("submit: " + w.status().ToString()), 1;
    // Both ranks submitted and the daemon handed the collective to its
    // engine: only the producer event holds it back now.
    if (!testing::Eventually(
            [&] { return testing::JobOpsInDaemon(d.socket(), "order").running >= 1; }, 10000)) {
      T.Fail("the collective never reached the engine");
    }
    if (w->Test()) T.Fail("the collective finished while its producer was still pending");
    for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = In(rank, i);  // the producer's output
    (*producer)->Complete();
    uint64_t seen_event = 0;
    absl::Status s = w->WaitOnStream(
        [&](uint64_t event_id) {
          seen_event = event_id;
          if (event_id == 0 || event_id > T.completion_events.size()) {
            return absl::InternalError("event id out of range");
          }
          device::IpcHandleBytes ch;
          std::memcpy(ch.data(), T.completion_events[event_id - 1].data(), ch.size());
          auto opened = device::fakeshm::SharedEvent::Open(ch);
          if (!opened.ok()) return opened.status();
          // The daemon recorded this event, and the record completed.
          if ((*opened)->block()->recorded.load() == 0) {
            return absl::InternalError("the daemon never recorded the completion event");
          }
          return FakeTrainerDevice::WaitEvent(ch, absl::Seconds(10));
        },
        absl::Seconds(30));
    if (!s.ok()) T.Fail("WaitOnStream: " + s.ToString());
    if (seen_event != w->completion_event_id() || seen_event == 0) {
      T.Fail("completion event id " + std::to_string(seen_event));
    }
    Expect(&T, "ordered all_reduce", T.F(kRecvOffset), kCount,
           [](uint64_t i) { return In(0, i) + In(1, i); });
    // CPU wait still works (no stream callback).
    if (Await(&T, T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "cpu wait")) {
      Expect(&T, "cpu wait", T.F(kRecvOffset), kCount,
             [](uint64_t i) { return In(0, i) + In(1, i); });
    }
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  }, 60000);
  EXPECT_EQ(d.Stop(), 0);
}

// The same legacy handle bytes naming new memory (the caching allocator
// handing an address out again): with a new generation the daemon maps the
// new memory even while the old allocation is still mapped for another
// buffer. Data proves which memory the collective read.
// Completion events are one per ring slot, so the op
// `ring_entries` later records the same event. WaitOnStream must enqueue the
// stream wait before that op can be submitted, else the wait captures the
// later op's record. The fake records the slot's event again (recorded
// count); while the stream-wait callback of op k runs, another thread
// submits op k + ring_entries: it must not get through before the callback
// returned, so the record count the callback sees is op k's.
TEST(DeviceDaemonTest, CompletionSlotIsNotReusedBeforeTheStreamWaitIsEnqueued) {
  constexpr int kRing = 16;
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig() + "data_plane:\n  ring_entries: 16\n")) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "slots", rank, 2, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    if (!g.ok()) return T.Fail("group"), 1;
    auto submit = [&] {
      return T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                 DataType::kFloat32);
    };
    auto first = submit();
    if (!first.ok()) return T.Fail("submit"), 1;
    // Fill the other slots, so the next submission reuses `first`'s.
    for (int i = 1; i < kRing; ++i) {
      if (!Await(&T, submit(), "fill " + std::to_string(i))) return 1;
    }
    std::atomic<bool> reused{false};
    std::thread later;
    absl::Status s = first->WaitOnStream(
        [&](uint64_t event_id) -> absl::Status {
          if (event_id == 0 || event_id > T.completion_events.size()) {
            return absl::InternalError("event id out of range");
          }
          device::IpcHandleBytes ch;
          std::memcpy(ch.data(), T.completion_events[event_id - 1].data(), ch.size());
          auto opened = device::fakeshm::SharedEvent::Open(ch);
          if (!opened.ok()) return opened.status();
          const uint64_t records = (*opened)->block()->recorded.load();
          later = std::thread([&] {
            auto w = submit();  // op first + kRing: the same completion event
            reused = true;
            if (w.ok()) (void)w->Wait(absl::Seconds(30));
          });
          // Give the other thread every chance to get through (bounded).
          for (int i = 0; i < 100 && !reused; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          if (reused || (*opened)->block()->recorded.load() != records) {
            return absl::InternalError(
                "the op reusing this completion event was submitted before the stream wait "
                "was enqueued: the wait would capture a later op's record");
          }
          return absl::OkStatus();  // here: cudaStreamWaitEvent on this op's record
        },
        absl::Seconds(30));
    if (!s.ok()) T.Fail("WaitOnStream: " + s.ToString());
    if (later.joinable()) later.join();
    if (!reused) T.Fail("the later submission never went through");
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 1;
  }, 90000);
  EXPECT_EQ(d.Stop(), 0);
}

// Through a real hsdpd: a trainer's VMM fds are open
// files of one file (same inode, as the driver's are). A second allocation
// registered without an allocation id must get its own mapping: the
// collective reads the second allocation's data, not the first's.
TEST(DeviceDaemonTest, TwoVmmAllocationsSharingAnInodeStayApart) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "inode", rank, 2, kAllocBytes)) return 1;
    auto second = T.dev.AllocateVmm(kAllocBytes);
    if (!second.ok()) return T.Fail("allocate"), 1;
    if (rank == 0) {  // rank 0's first allocation is a VMM one too: same inode
      struct stat a, b;
      if (::fstat(T.alloc->fd.get(), &a) != 0 || ::fstat((*second)->fd.get(), &b) != 0 ||
          a.st_ino != b.st_ino) {
        T.Fail("the fake's VMM fds do not share an inode");
      }
    }
    auto id2 = T.Register(**second, 0, (*second)->bytes, 1, /*vmm=*/true);
    auto g = T.client->NewGroup({0, 1});
    if (!id2.ok() || !g.ok()) return T.Fail("setup: " + id2.status().ToString()), 1;
    float* f2 = static_cast<float*>((*second)->data);
    for (uint64_t i = 0; i < kCount; ++i) {
      T.F(0)[i] = In(rank, i);
      f2[i] = In(rank, i) + 100.0f;
    }
    if (Await(&T, T.client->AllReduce(*g, {*id2, 0}, {*id2, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "all_reduce on the second allocation")) {
      for (uint64_t i = 0; i < kCount; ++i) {
        const float want = In(0, i) + In(1, i) + 200.0f;
        if (f2[kRecvOffset / 4 + i] != want) {
          T.Fail("second allocation [" + std::to_string(i) + "] got " +
                 std::to_string(f2[kRecvOffset / 4 + i]) + ", want " + std::to_string(want));
          break;
        }
      }
    }
    if (Await(&T, T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "all_reduce on the first allocation")) {
      Expect(&T, "first allocation", T.F(kRecvOffset), kCount,
             [](uint64_t i) { return In(0, i) + In(1, i); });
    }
    (void)T.client->FreeDeviceBuffer(*id2);
    FakeTrainerDevice::Free(*std::move(second));
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 1;
  }, 60000);
  EXPECT_EQ(d.Stop(), 0);
}

// Each trainer numbers the GPUs the other way round
// (as CUDA_VISIBLE_DEVICES=1,0 would) but sends the GPU's UUID: the daemon
// uses its own ordinal for that UUID, so the data lands on the right
// device; an unknown UUID is refused by name.
TEST(DeviceDaemonTest, TrainersNameTheirGpuByUuidWhateverTheirNumbering) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    T.by_uuid = true;
    T.claimed_device = 1 - rank;  // the other GPU's ordinal in the daemon's numbering
    if (!T.Start(d.socket(), "uuid", rank, 2, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    if (!g.ok()) return T.Fail("group"), 1;
    for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = In(rank, i);
    if (Await(&T, T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "all_reduce by uuid")) {
      Expect(&T, "all_reduce by uuid", T.F(kRecvOffset), kCount,
             [](uint64_t i) { return In(0, i) + In(1, i); });
    }
    DeviceBufferSpec spec;
    spec.kind = DeviceHandleKind::kLegacyIpc;
    spec.device = rank;
    spec.device_uuid = std::string(16, '\x5a');
    spec.legacy_handle.assign(reinterpret_cast<const char*>(T.alloc->handle.data()), 64);
    spec.size_bytes = 64;
    auto bad = T.client->RegisterDeviceBuffer(spec);
    if (bad.ok() || bad.status().message().find("GPU-5a5a5a5a-5a5a") == std::string::npos) {
      T.Fail("an unknown UUID was not refused by name: " + bad.status().ToString());
    }
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 1;
  }, 60000);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DeviceDaemonTest, FreedAndReusedHandleNeverHitsAStaleMapping) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "stale", rank, 2, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    if (!g.ok()) return T.Fail("NewGroup"), 1;
    // Allocation "slot 7", generation 1: two buffers on it.
    auto a1 = T.dev.AllocateLegacy(kAllocBytes, 7);
    if (!a1.ok()) return T.Fail("alloc"), 1;
    auto keep = T.Register(**a1, 0, 4096, 1, false);        // stays registered
    auto old_buf = T.Register(**a1, 8192, kCount * 4, 1, false);
    if (!keep.ok() || !old_buf.ok()) return T.Fail("register gen 1"), 1;
    float* old_data = reinterpret_cast<float*>(static_cast<char*>((*a1)->data) + 8192);
    for (uint64_t i = 0; i < kCount; ++i) old_data[i] = 5.0f;
    if (!Await(&T, T.client->AllReduce(*g, {*old_buf, 0}, {T.buffer, kRecvOffset}, kCount,
                                       DataType::kFloat32),
               "gen 1")) {
      return 2;
    }
    Expect(&T, "gen 1", T.F(kRecvOffset), kCount, [](uint64_t) { return 10.0f; });
    // Free the buffer and the allocation; the same name (same handle bytes)
    // now names new memory with other contents.
    if (!T.client->FreeDeviceBuffer(*old_buf).ok()) T.Fail("free");
    for (uint64_t i = 0; i < kCount; ++i) old_data[i] = 5.0f;  // the old memory keeps 5s
    FakeTrainerDevice::Free(std::move(*a1));
    auto a2 = T.dev.AllocateLegacy(kAllocBytes, 7);
    if (!a2.ok()) return T.Fail("realloc"), 1;
    float* new_data = reinterpret_cast<float*>(static_cast<char*>((*a2)->data) + 8192);
    for (uint64_t i = 0; i < kCount; ++i) new_data[i] = float(rank + 1);
    auto new_buf = T.Register(**a2, 8192, kCount * 4, 2, false);
    if (!new_buf.ok()) return T.Fail("register gen 2: " + new_buf.status().ToString()), 1;
    if (Await(&T, T.client->AllReduce(*g, {*new_buf, 0}, {T.buffer, kRecvOffset}, kCount,
                                      DataType::kFloat32),
              "gen 2")) {
      // 1 + 2 from the new memory; a stale mapping would give 5 + 5.
      Expect(&T, "gen 2", T.F(kRecvOffset), kCount, [](uint64_t) { return 3.0f; });
    }
    FakeTrainerDevice::Free(std::move(*a2));
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  }, 60000);
  EXPECT_EQ(d.Stop(), 0);
}

// A trainer killed while the daemon maps its memory, has opened its events
// and made completion events for it: once the session ends, nothing of it
// is left in the daemon (no mapping, no fd, no event block), and the daemon
// serves a new job.
TEST(DeviceDaemonTest, KilledTrainerLeaksNoMapping) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  ASSERT_EQ(testing::FakeDeviceObjectsIn(d.pid()), 0);
  Child victim([&](FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "victim", 0, 1, kAllocBytes)) return 1;
    auto legacy = T.dev.AllocateLegacy(kAllocBytes, 3);
    auto ev = T.dev.CreateEvent();
    if (!legacy.ok() || !ev.ok()) return 1;
    if (!T.Register(**legacy, 0, 4096, 1, false).ok()) return T.Fail("register"), 1;
    const auto& h = (*ev)->shared->handle();
    if (!T.client->RegisterDeviceEvent(0, std::string(reinterpret_cast<const char*>(h.data()),
                                                      h.size()))
             .ok()) {
      return T.Fail("event"), 1;
    }
    std::fprintf(out, "ready\n");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  });
  ASSERT_TRUE(victim.WaitFor("ready", 20000)) << victim.output() << d.Log();
  // Mapped: two allocations, their fd (VMM), the events.
  EXPECT_GT(testing::FakeDeviceObjectsIn(d.pid()), 2);
  victim.Kill(SIGKILL);
  victim.Finish(5000);
  // What the killed trainer left in /dev/shm is its own (the daemon holds none of it).
  testing::RunCommand("rm -f /dev/shm/hsdp-fake*-" + std::to_string(victim.pid()) + "-*");
  EXPECT_TRUE(testing::Eventually(
      [&] { return testing::FakeDeviceObjectsIn(d.pid()) == 0; }, 10000))
      << testing::FakeDeviceObjectsIn(d.pid()) << " fake device objects left\n"
      << testing::ReadFile("/proc/" + std::to_string(d.pid()) + "/maps");
  EXPECT_TRUE(testing::Eventually([&] { return testing::CountSessions(d.socket()) == 0; }, 10000));
  // The daemon serves a new trainer.
  RunRanks(1, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "after", rank, 1, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0});
    if (!g.ok()) return 1;
    for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = 2.0f;
    if (!Await(&T, T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                       DataType::kFloat32),
               "after")) {
      return 2;
    }
    Expect(&T, "after", T.F(kRecvOffset), kCount, [](uint64_t) { return 2.0f; });
    return T.failures == 0 ? 0 : 2;
  }, 30000);
  EXPECT_EQ(d.Stop(), 0);
}

// Host (CPU) buffers keep working on a daemon that runs the device engine,
// in the same group as device operations.
TEST(DeviceDaemonTest, CpuBuffersKeepWorkingOnTheSameDaemon) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  RunRanks(2, [&](int rank, FILE* out) -> int {
    DeviceTrainer T;
    T.out = out;
    if (!T.Start(d.socket(), "mixed", rank, 2, kAllocBytes)) return 1;
    auto g = T.client->NewGroup({0, 1});
    auto host = T.client->AllocateBuffer(kCount * 4 * 2, "host");
    if (!g.ok() || !host.ok()) return T.Fail("setup"), 1;
    float* hf = static_cast<float*>(host->data);
    for (int round = 0; round < 3; ++round) {
      for (uint64_t i = 0; i < kCount; ++i) hf[i] = In(rank, i) + round;
      if (Await(&T, T.client->AllReduce(*g, {host->id, 0}, {host->id, kCount * 4}, kCount,
                                        DataType::kFloat32),
                "host")) {
        Expect(&T, "host", hf + kCount, kCount,
               [&](uint64_t i) { return In(0, i) + In(1, i) + 2 * round; });
      }
      for (uint64_t i = 0; i < kCount; ++i) T.F(0)[i] = In(rank, i) * 2 + round;
      if (Await(&T, T.client->AllReduce(*g, {T.buffer, 0}, {T.buffer, kRecvOffset}, kCount,
                                        DataType::kFloat32),
                "device")) {
        Expect(&T, "device", T.F(kRecvOffset), kCount,
               [&](uint64_t i) { return (In(0, i) + In(1, i)) * 2 + 2 * round; });
      }
    }
    // Mixing a host and a device buffer in one operation is refused by the daemon.
    auto mixed = T.client->AllReduce(*g, {host->id, 0}, {T.buffer, kRecvOffset}, kCount,
                                     DataType::kFloat32);
    if (mixed.ok()) {
      absl::Status s = mixed->Wait(absl::Seconds(30));
      if (s.ok() || s.message().find("host buffer") == std::string::npos) {
        T.Fail("mixed host/device: " + s.ToString());
      }
    }
    std::fprintf(out, "rank %d done, failures %d\n", rank, T.failures);
    return T.failures == 0 ? 0 : 2;
  }, 60000);
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
