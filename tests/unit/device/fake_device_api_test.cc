// FakeDeviceApi: the properties the engine and the buffer registry rely on
// (address reuse, stale handles, stream order, event generations, priorities).
#include "daemon/device/fake_device_api.h"

#include <atomic>
#include <future>
#include <thread>

#include "gtest/gtest.h"

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
  auto a = dev.Allocate(1, 1000);
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

TEST(FakeDeviceApiTest, DestroyingAStreamReleasesAPendingWait) {
  FakeDeviceApi dev(1);
  auto producer = dev.CreateStream(0, StreamPriority::kDefault);
  auto consumer = dev.CreateStream(0, StreamPriority::kDefault);
  auto ev = dev.CreateEvent(0, false);
  std::promise<void> gate;
  auto f = gate.get_future().share();
  ASSERT_TRUE(dev.EnqueueHostFn(*producer, [f] { f.wait(); return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev.RecordEvent(*ev, *producer).ok());
  ASSERT_TRUE(dev.StreamWaitEvent(*consumer, *ev).ok());
  dev.DestroyStream(*consumer);  // returns: the wait gives up
  EXPECT_EQ(dev.live_streams(), 1);
  gate.set_value();
}

}  // namespace
}  // namespace hsdp::device
