// FakeDeviceApi: the properties the engine and the buffer registry rely on
// (address reuse, stale handles, stream order, event generations, priorities).
#include "daemon/device/fake_device_api.h"

#include <atomic>
#include <cstdint>
#include <future>
#include <chrono>
#include <thread>

#include "daemon/device/fake_shm.h"
#include "gtest/gtest.h"
#include "common/wait.h"

namespace hsdp::device {
namespace {

TEST(FakeDeviceApiTest, FreedAddressIsReusedWithANewGeneration) {
  FakeDeviceApi dev(1, 1 << 20);
  auto a = dev.Allocate(0, 4096);
  ASSERT_TRUE(a.ok());
  auto h1 = dev.ExportLegacy(*a);
  ASSERT_TRUE(h1.ok());
  ASSERT_TRUE(dev.Free(*a).ok());
  auto b = dev.Allocate(0, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);  // the same address comes back, as with a caching allocator
  auto h2 = dev.ExportLegacy(*b);
  ASSERT_TRUE(h2.ok());
  EXPECT_NE(*h1, *h2);  // but the handle differs
  EXPECT_FALSE(dev.ImportLegacy(0, *h1).ok());  // the old one is stale
  auto m = dev.ImportLegacy(0, *h2);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ptr, *b);
  EXPECT_EQ(dev.live_mappings(), 1);
  ASSERT_TRUE(dev.Unmap(*m).ok());
  EXPECT_EQ(dev.live_mappings(), 0);
  EXPECT_FALSE(dev.Unmap(*m).ok());
}

TEST(FakeDeviceApiTest, AddressRangeAndFdExport) {
  FakeDeviceApi dev(2, 1 << 20);
  auto a = dev.Allocate(1, 1000, device::AllocSharing::kPosixFd);
  ASSERT_TRUE(a.ok());
  auto r = dev.GetAddressRange(*a + 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->base, *a);
  EXPECT_EQ(r->bytes, 1024u);
  EXPECT_FALSE(dev.ExportLegacy(*a + 100).ok());  // not a base
  auto fd = dev.ExportFd(*a);
  ASSERT_TRUE(fd.ok());
  EXPECT_FALSE(dev.ImportFd(0, fd->get(), 1000).ok());    // wrong device
  EXPECT_FALSE(dev.ImportFd(1, fd->get(), 4096).ok());    // larger than the allocation
  auto m = dev.ImportFd(1, fd->get(), 1000);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, 1024u);
  EXPECT_EQ(dev.imports(), 1);
  EXPECT_FALSE(dev.Allocate(0, 2 << 20).ok());  // does not fit the arena
  EXPECT_FALSE(dev.Allocate(2, 16).ok());       // no such device
}

// Memory nobody exports asks for no
// shareable handle type, so it still works where POSIX-fd handles are not
// supported (the fake models such a device); only exportable allocations
// need the support, and only they can be exported as an fd.
TEST(FakeDeviceApiTest, PrivateAllocationsNeedNoShareableHandleType) {
  FakeDeviceApi dev(1, 1 << 20);
  dev.set_posix_fd_supported(false);
  auto scratch = dev.Allocate(0, 4096);  // what the NCCL engine's scratch asks for
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  auto shared = dev.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition);
  dev.set_posix_fd_supported(true);
  EXPECT_EQ(dev.ExportFd(*scratch).status().code(), absl::StatusCode::kInvalidArgument);
  auto exportable = dev.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  ASSERT_TRUE(exportable.ok());
  EXPECT_TRUE(dev.ExportFd(*exportable).ok());
}

// A trainer's ordinal is not the daemon's
// (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER); the GPU's UUID is the same in
// every process. ResolveDevice maps a UUID to the daemon's ordinal and
// refuses an unknown one by name.
TEST(FakeDeviceApiTest, DevicesResolveByUuidWhateverTheClientsNumbering) {
  FakeDeviceApi dev(2, 1 << 20);
  const DeviceUuid u0 = *dev.UuidOf(0), u1 = *dev.UuidOf(1);
  EXPECT_NE(u0, u1);
  auto bytes = [](const DeviceUuid& u) {
    return std::string(reinterpret_cast<const char*>(u.data()), u.size());
  };
  // The trainer calls the daemon's GPU 1 its GPU 0: the UUID wins.
  EXPECT_EQ(*ResolveDevice(dev, /*device=*/0, bytes(u1)), 1);
  EXPECT_EQ(*ResolveDevice(dev, /*device=*/1, bytes(u0)), 0);
  EXPECT_EQ(*ResolveDevice(dev, /*device=*/1, ""), 1);  // an old client: its ordinal
  DeviceUuid other{};
  other.fill(0xab);
  auto unknown = ResolveDevice(dev, 0, bytes(other));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("GPU-abababab-abab-abab-abab-abababababab"),
            std::string::npos)
      << unknown.status();
  EXPECT_EQ(ResolveDevice(dev, 0, "short").status().code(), absl::StatusCode::kInvalidArgument);
  dev.set_uuid(0, other);  // another machine's numbering
  EXPECT_EQ(*ResolveDevice(dev, 1, bytes(other)), 0);
}

TEST(FakeDeviceApiTest, StreamWaitsOnlyForTheRecordItSaw) {
  FakeDeviceApi dev(1);
  auto producer = dev.CreateStream(0, StreamPriority::kDefault);
  auto consumer = dev.CreateStream(0, StreamPriority::kHigh);
  ASSERT_TRUE(producer.ok() && consumer.ok());
  EXPECT_EQ(*dev.PriorityOf(*consumer), StreamPriority::kHigh);
  auto ev = dev.CreateEvent(0, true);
  ASSERT_TRUE(ev.ok());
  std::promise<void> gate;
  auto f = gate.get_future().share();
  std::atomic<int> step{0};
  ASSERT_TRUE(dev.EnqueueHostFn(*producer, [&, f] { f.wait(); step = 1; return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev.RecordEvent(*ev, *producer).ok());
  EXPECT_FALSE(*dev.EventDone(*ev));
  ASSERT_TRUE(dev.StreamWaitEvent(*consumer, *ev).ok());
  std::atomic<int> seen{-1};
  ASSERT_TRUE(dev.EnqueueHostFn(*consumer, [&] { seen = step.load(); return absl::OkStatus(); }).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(seen.load(), -1);  // still waiting
  gate.set_value();
  dev.SyncStream(*consumer);
  EXPECT_EQ(seen.load(), 1);
  EXPECT_TRUE(*dev.EventDone(*ev));
}

TEST(FakeDeviceApiTest, ImportedEventSharesTheRecordsAndErrorsReachTheEvent) {
  FakeDeviceApi dev(1);
  auto s = dev.CreateStream(0, StreamPriority::kDefault);
  auto ev = dev.CreateEvent(0, true);
  auto plain = dev.CreateEvent(0, false);
  EXPECT_FALSE(dev.ExportEvent(*plain).ok());
  auto h = dev.ExportEvent(*ev);
  ASSERT_TRUE(h.ok());
  auto imported = dev.ImportEvent(0, *h);
  ASSERT_TRUE(imported.ok());
  ASSERT_TRUE(dev.EnqueueHostFn(*s, [] { return absl::DataLossError("kernel fault"); }).ok());
  ASSERT_TRUE(dev.RecordEvent(*ev, *s).ok());
  dev.SyncStream(*s);
  auto done = dev.EventDone(*imported);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDataLoss);
  // The error is reported once; the next record is clean.
  ASSERT_TRUE(dev.RecordEvent(*ev, *s).ok());
  dev.SyncStream(*s);
  EXPECT_TRUE(*dev.EventDone(*imported));
  dev.DestroyEvent(*ev);
  EXPECT_FALSE(dev.ImportEvent(0, *h).ok());
}

TEST(FakeDeviceApiTest, ScaleCastFusesScaleAndConversion) {
  FakeDeviceApi dev(1);
  auto s = dev.CreateStream(0, StreamPriority::kDefault);
  auto src = dev.Allocate(0, 16);
  auto dst = dev.Allocate(0, 8);
  float in[4] = {1, 2, 3, -4};
  ASSERT_TRUE(dev.CopyToDevice(*src, in, 16).ok());
  ASSERT_TRUE(dev.ScaleCastAsync(*src, DataType::kFloat32, *dst, DataType::kBFloat16, 4, 0.5, *s).ok());
  ASSERT_TRUE(dev.ScaleCastAsync(*dst, DataType::kBFloat16, *src, DataType::kFloat32, 4, 4.0, *s).ok());
  dev.SyncStream(*s);
  float out[4];
  ASSERT_TRUE(dev.CopyToHost(out, *src, 16).ok());
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[3], -8.0f);
  EXPECT_FALSE(dev.ScaleCastAsync(*src, DataType::kInt32, *dst, DataType::kFloat32, 1, 1, *s).ok());
  EXPECT_FALSE(dev.MemcpyAsync(*src, 16, 8, *s).ok());  // outside every device
}

// As cudaStreamDestroy: the call returns at once, but the work queued on the
// stream still runs — late, when the event it waits on fires.
TEST(FakeDeviceApiTest, ADestroyedStreamRunsItsQueuedWorkLate) {
  FakeDeviceApi dev(1);
  auto producer = dev.CreateStream(0, StreamPriority::kDefault);
  auto consumer = dev.CreateStream(0, StreamPriority::kDefault);
  auto ev = dev.CreateEvent(0, false);
  std::promise<void> gate;
  auto f = gate.get_future().share();
  std::atomic<bool> ran{false};
  ASSERT_TRUE(dev.EnqueueHostFn(*producer, [f] { f.wait(); return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev.RecordEvent(*ev, *producer).ok());
  ASSERT_TRUE(dev.StreamWaitEvent(*consumer, *ev).ok());
  ASSERT_TRUE(dev.EnqueueHostFn(*consumer, [&] { ran = true; return absl::OkStatus(); }).ok());
  dev.DestroyStream(*consumer);  // returns although the wait has not fired
  EXPECT_EQ(dev.live_streams(), 1);
  EXPECT_EQ(dev.draining_streams(), 1);
  EXPECT_FALSE(ran.load());
  gate.set_value();
  dev.SyncStream(*producer);
  EXPECT_TRUE(hsdp::testing::Eventually([&] { return dev.draining_streams() == 0; }, 2000, 1));
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(dev.draining_streams(), 0);
}

// A kernel checks its operands when it runs: memory freed while it was queued
// is an illegal address, sticky for every later query (as on a GPU).
TEST(FakeDeviceApiTest, AKernelOnFreedMemoryIsAStickyIllegalAddress) {
  FakeDeviceApi dev(1);
  auto s = dev.CreateStream(0, StreamPriority::kDefault);
  auto a = dev.Allocate(0, 64);
  auto b = dev.Allocate(0, 64);
  ASSERT_TRUE(s.ok() && a.ok() && b.ok());
  std::promise<void> gate;
  auto f = gate.get_future().share();
  ASSERT_TRUE(dev.EnqueueHostFn(*s, [f] { f.wait(); return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev.MemcpyAsync(*b, *a, 64, *s).ok());  // enqueued while both are live
  ASSERT_TRUE(dev.Free(*a).ok());
  gate.set_value();
  dev.SyncStream(*s);
  EXPECT_EQ(dev.faults(), 1);
  EXPECT_NE(dev.first_fault().find("memcpy"), std::string::npos) << dev.first_fault();
  auto ev = dev.CreateEvent(0, false);
  ASSERT_TRUE(dev.RecordEvent(*ev, *s).ok());
  dev.SyncStream(*s);
  EXPECT_EQ(dev.EventDone(*ev).status().code(), absl::StatusCode::kInternal);
}

// The intra-device reduction: scaled inputs combined, an optional running
// value in dst, one rounding to the output type; integers in their own type.
TEST(FakeDeviceApiTest, ReduceScalesCombinesAccumulatesAndCasts) {
  FakeDeviceApi dev(1);
  auto s = dev.CreateStream(0, StreamPriority::kDefault);
  auto a = dev.Allocate(0, 16), b = dev.Allocate(0, 16), out = dev.Allocate(0, 16);
  ASSERT_TRUE(s.ok() && a.ok() && b.ok() && out.ok());
  const float av[4] = {1, 2, 3, 4}, bv[4] = {10, 20, 30, 40};
  ASSERT_TRUE(dev.CopyToDevice(*a, av, 16).ok());
  ASSERT_TRUE(dev.CopyToDevice(*b, bv, 16).ok());
  ASSERT_TRUE(dev.ReduceAsync({*a, *b}, DataType::kFloat32, *out, DataType::kFloat32, 4,
                              ReduceOp::kSum, 0.5, false, *s).ok());
  ASSERT_TRUE(dev.ReduceAsync({*a}, DataType::kFloat32, *out, DataType::kFloat32, 4,
                              ReduceOp::kMax, 4.0, /*accumulate=*/true, *s).ok());
  dev.SyncStream(*s);
  float got[4];
  ASSERT_TRUE(dev.CopyToHost(got, *out, 16).ok());
  // max((a + b) / 2, 4a): 5.5 vs 4, 11 vs 8, 16.5 vs 12, 22 vs 16
  EXPECT_EQ(std::vector<float>(got, got + 4), (std::vector<float>{5.5f, 11, 16.5f, 22}));
  const int32_t iv[4] = {INT32_MAX, 1, -5, 7};
  ASSERT_TRUE(dev.CopyToDevice(*a, iv, 16).ok());
  ASSERT_TRUE(dev.ReduceAsync({*a, *a}, DataType::kInt32, *out, DataType::kInt32, 4,
                              ReduceOp::kSum, 1.0, false, *s).ok());
  dev.SyncStream(*s);
  int32_t isum[4];
  ASSERT_TRUE(dev.CopyToHost(isum, *out, 16).ok());
  EXPECT_EQ(isum[0], -2);  // wraps, as the CPU kernels
  EXPECT_EQ(isum[2], -10);
  // A scale or a cast on integers is refused.
  EXPECT_FALSE(dev.ReduceAsync({*a}, DataType::kInt32, *out, DataType::kInt32, 4, ReduceOp::kSum,
                               0.5, false, *s).ok());
  EXPECT_EQ(dev.faults(), 0);
}

// Opening a legacy handle that is open already
// returns the same pointer and counts a reference (cuIpcOpenMemHandle, CUDA
// 13 cuda.h). The fake does the same; each open is its own mapping, and the
// memory goes only with the last Unmap.
TEST(FakeDeviceApiTest, ReopenedLegacyHandleIsTheSamePointerCountedTwice) {
  FakeDeviceApi dev(1, 1 << 20, /*cross_process=*/true);
  fakeshm::FakeTrainerDevice trainer;
  auto legacy = trainer.AllocateLegacy(4096, 98);
  ASSERT_TRUE(legacy.ok());
  auto a = dev.ImportLegacy(0, (*legacy)->handle);
  auto b = dev.ImportLegacy(0, (*legacy)->handle);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ptr, b->ptr);      // as the driver does
  EXPECT_NE(a->token, b->token);  // two references, two unmaps
  EXPECT_EQ(dev.live_mappings(), 2);
  ASSERT_TRUE(dev.Unmap(*a).ok());
  EXPECT_TRUE(dev.InArena(b->ptr, 4096));  // still mapped for the other open
  const uint32_t v = 0xBEEF;
  ASSERT_TRUE(dev.CopyToDevice(b->ptr, &v, 4).ok());
  EXPECT_EQ(*static_cast<uint32_t*>((*legacy)->data), v);
  ASSERT_TRUE(dev.Unmap(*b).ok());
  EXPECT_FALSE(dev.InArena(b->ptr, 4096));  // the last reference unmapped it
  EXPECT_EQ(dev.Unmap(*b).code(), absl::StatusCode::kNotFound);
  fakeshm::FakeTrainerDevice::Free(*std::move(legacy));
}

// Cross-process mode (engine.device: fake): imports map memory another
// process owns (a memfd, or a named shm object), interprocess events are
// shared counters, and unmapping releases the mapping.
TEST(FakeDeviceApiTest, CrossProcessModeMapsForeignMemoryAndSharesEvents) {
  FakeDeviceApi dev(2, 1 << 20, /*cross_process=*/true);
  fakeshm::FakeTrainerDevice trainer;
  auto vmm = trainer.AllocateVmm(8192);
  auto legacy = trainer.AllocateLegacy(4096, 99);
  ASSERT_TRUE(vmm.ok() && legacy.ok());
  auto m1 = dev.ImportFd(1, (*vmm)->fd.get(), 8192);
  auto m2 = dev.ImportLegacy(0, (*legacy)->handle);
  ASSERT_TRUE(m1.ok()) << m1.status();
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_FALSE(dev.ImportFd(0, (*vmm)->fd.get(), 8193).ok());  // claims more than exists
  // Writes through the daemon's mapping are the trainer's bytes.
  const uint32_t v = 0xC0FFEE;
  ASSERT_TRUE(dev.CopyToDevice(m1->ptr + 4, &v, 4).ok());
  EXPECT_EQ(static_cast<uint32_t*>((*vmm)->data)[1], v);
  EXPECT_TRUE(dev.InArena(m2->ptr, 4096));
  EXPECT_FALSE(dev.InArena(m2->ptr, 4097));
  // A producer event recorded by the trainer holds the daemon's stream back.
  auto producer = trainer.CreateEvent();
  ASSERT_TRUE(producer.ok());
  auto ev = dev.ImportEvent(1, (*producer)->shared->handle());
  ASSERT_TRUE(ev.ok()) << ev.status();
  auto s = dev.CreateStream(1, StreamPriority::kDefault);
  (*producer)->Record();
  ASSERT_TRUE(dev.StreamWaitEvent(*s, *ev).ok());
  auto done = dev.CreateEvent(1, true);
  ASSERT_TRUE(dev.RecordEvent(*done, *s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(*dev.EventDone(*done));
  (*producer)->Complete();
  dev.SyncStream(*s);
  EXPECT_TRUE(*dev.EventDone(*done));
  // The daemon's interprocess event is visible to the trainer by its handle.
  auto handle = dev.ExportEvent(*done);
  ASSERT_TRUE(handle.ok());
  EXPECT_TRUE(fakeshm::FakeTrainerDevice::WaitEvent(*handle, absl::Seconds(5)).ok());
  EXPECT_FALSE(fakeshm::HandleName(fakeshm::kLegacyMagic, *handle).ok());  // wrong kind
  ASSERT_TRUE(dev.Unmap(*m1).ok());
  ASSERT_TRUE(dev.Unmap(*m2).ok());
  EXPECT_EQ(dev.live_mappings(), 0);
  EXPECT_FALSE(dev.InArena(m1->ptr, 4));
  dev.DestroyEvent(*done);
  dev.DestroyEvent(*ev);
  fakeshm::FakeTrainerDevice::Free(std::move(*vmm));
  fakeshm::FakeTrainerDevice::Free(std::move(*legacy));
}

}  // namespace
}  // namespace hsdp::device
