// DeviceBufferRegistry over FakeDeviceApi: the mapping cache (shared
// allocations, freed-and-reused addresses), unmapping, limits, validation of
// what a client sends, and descriptor resolution for device buffers.
#include "daemon/session/device_buffers.h"

#include <sys/stat.h>
#include <unistd.h>

#include <future>

#include "daemon/device/device_pool.h"
#include "daemon/device/fake_device_api.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using device::FakeDeviceApi;
using device::HandleKind;

class DeviceBuffersTest : public ::testing::Test {
 protected:
  DeviceBuffersTest() : dev_(2, 1 << 22), reg_(&dev_) {}

  DeviceBufferRequest Legacy(device::DevicePtr base, uint64_t offset, uint64_t size, int d = 0,
                             uint64_t generation = 0) {
    DeviceBufferRequest r;
    r.kind = HandleKind::kLegacyIpc;
    r.device = d;
    r.handle = *dev_.ExportLegacy(base);
    r.offset = offset;
    r.size_bytes = size;
    r.generation = generation;
    return r;
  }
  DeviceBufferRequest Vmm(device::DevicePtr base, uint64_t alloc, uint64_t offset, uint64_t size,
                          uint64_t generation = 0) {
    DeviceBufferRequest r;
    r.kind = HandleKind::kVmmFd;
    r.device = 0;
    r.fd = *dev_.ExportFd(base);
    r.allocation_bytes = alloc;
    r.offset = offset;
    r.size_bytes = size;
    r.generation = generation;
    return r;
  }

  FakeDeviceApi dev_;
  DeviceBufferRegistry reg_;
};

TEST_F(DeviceBuffersTest, BuffersOfOneAllocationShareOneMappingUntilTheLastIsFreed) {
  auto base = dev_.Allocate(0, 8192);
  ASSERT_TRUE(base.ok());
  auto a = reg_.Register(1, Legacy(*base, 0, 4096));
  auto b = reg_.Register(1, Legacy(*base, 4096, 4096));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_TRUE(IsDeviceBufferId(*a));
  EXPECT_NE(*a, *b);
  EXPECT_EQ(dev_.imports(), 1);  // one import for two buffers
  EXPECT_EQ(dev_.live_mappings(), 1);
  auto rb = reg_.Resolve(1, *b, 16, 32, "send");
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->ptr, *base + 4096 + 16);
  ASSERT_TRUE(reg_.Free(1, *a).ok());
  EXPECT_EQ(dev_.live_mappings(), 1);  // b still uses it
  ASSERT_TRUE(reg_.Free(1, *b).ok());
  // An operation still holding a resolved range keeps the mapping until it
  // drops it (never unmapped under a running collective).
  EXPECT_EQ(reg_.node_mappings(), 0u);
  EXPECT_EQ(dev_.live_mappings(), 1);
  rb->keep.reset();
  EXPECT_EQ(dev_.live_mappings(), 0);  // unmapped with the last holder
  EXPECT_EQ(reg_.Free(1, *b).code(), absl::StatusCode::kNotFound);
}

TEST_F(DeviceBuffersTest, AFreedAndReusedAddressNeverHitsAStaleMapping) {
  auto a = dev_.Allocate(0, 4096);
  auto old_buf = reg_.Register(1, Legacy(*a, 0, 4096));
  ASSERT_TRUE(old_buf.ok());
  // The client frees the allocation without telling the daemon, and its
  // allocator hands the same address out again.
  ASSERT_TRUE(dev_.Free(*a).ok());
  auto b = dev_.Allocate(0, 4096);
  ASSERT_EQ(*a, *b);
  auto new_buf = reg_.Register(1, Legacy(*b, 0, 4096));
  ASSERT_TRUE(new_buf.ok()) << new_buf.status();
  EXPECT_EQ(dev_.imports(), 2);  // a cache miss: the identity changed, not the address
  EXPECT_EQ(reg_.Stats(1).mappings, 2u);
  ASSERT_TRUE(reg_.Free(1, *old_buf).ok());
  EXPECT_EQ(reg_.Stats(1).mappings, 1u);
  // VMM: same allocation re-exported with a bumped generation is a new identity too.
  auto v = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  auto v1 = reg_.Register(1, Vmm(*v, 4096, 0, 1024, /*generation=*/7));
  auto v2 = reg_.Register(1, Vmm(*v, 4096, 0, 1024, /*generation=*/8));
  ASSERT_TRUE(v1.ok() && v2.ok()) << v1.status() << v2.status();
  EXPECT_EQ(dev_.imports(), 4);
}

// An exported cuMem fd is an open file of the
// driver's control device, so every exported fd has the same (st_dev,
// st_ino). The fake exports fds that way; two allocations of one session must
// still get two mappings, and buffers of one allocation (the same open file)
// one mapping.
TEST_F(DeviceBuffersTest, VmmFdsSharingOneInodeAreStillTwoAllocations) {
  auto a = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  auto b = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(dev_.CopyToDevice(*a, "AAAA", 4).ok());
  ASSERT_TRUE(dev_.CopyToDevice(*b, "BBBB", 4).ok());
  DeviceBufferRequest ra = Vmm(*a, 4096, 0, 4096);
  DeviceBufferRequest rb = Vmm(*b, 4096, 0, 4096);
  struct stat sa, sb;
  ASSERT_EQ(::fstat(ra.fd.get(), &sa), 0);
  ASSERT_EQ(::fstat(rb.fd.get(), &sb), 0);
  ASSERT_EQ(sa.st_ino, sb.st_ino);  // the fake behaves like the driver here
  ASSERT_EQ(sa.st_dev, sb.st_dev);
  UniqueFd a_again(::dup(ra.fd.get()));  // the same open file, as a client resends it
  auto ia = reg_.Register(1, std::move(ra));
  auto ib = reg_.Register(1, std::move(rb));
  ASSERT_TRUE(ia.ok() && ib.ok()) << ia.status() << ib.status();
  auto pa = reg_.Resolve(1, *ia, 0, 4, "send");
  auto pb = reg_.Resolve(1, *ib, 0, 4, "send");
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(pa->ptr, *a);
  EXPECT_EQ(pb->ptr, *b);  // not a's mapping
  char got[4];
  ASSERT_TRUE(dev_.CopyToHost(got, pb->ptr, 4).ok());
  EXPECT_EQ(std::string(got, 4), "BBBB");
  EXPECT_EQ(reg_.Stats(1).mappings, 2u);
  // A second buffer of `a` through the same open file shares its mapping.
  DeviceBufferRequest ra2;
  ra2.kind = HandleKind::kVmmFd;
  ra2.device = 0;
  ra2.fd = std::move(a_again);
  ra2.allocation_bytes = 4096;
  ra2.offset = 1024;
  ra2.size_bytes = 1024;
  auto ia2 = reg_.Register(1, std::move(ra2));
  ASSERT_TRUE(ia2.ok()) << ia2.status();
  auto pa2 = reg_.Resolve(1, *ia2, 0, 4, "send");
  ASSERT_TRUE(pa2.ok());
  EXPECT_EQ(pa2->ptr, *a + 1024);
  if (DeviceBufferRegistry::CanCompareOpenFiles()) {
    EXPECT_EQ(reg_.Stats(1).mappings, 2u);
  }
}

// The client may name the allocation (allocation_id): buffers with one id
// share a mapping; another exported file under an id already in use is
// refused by name when the kernel can compare open files.
TEST_F(DeviceBuffersTest, VmmAllocationIdKeysTheMapping) {
  auto a = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  auto b = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  DeviceBufferRequest r1 = Vmm(*a, 4096, 0, 512);
  r1.allocation_id = 11;
  UniqueFd same(::dup(r1.fd.get()));
  auto i1 = reg_.Register(1, std::move(r1));
  ASSERT_TRUE(i1.ok()) << i1.status();
  DeviceBufferRequest r2 = Vmm(*a, 4096, 512, 512);
  r2.fd = std::move(same);
  r2.allocation_id = 11;
  auto i2 = reg_.Register(1, std::move(r2));
  ASSERT_TRUE(i2.ok()) << i2.status();
  EXPECT_EQ(reg_.Stats(1).mappings, 1u);
  DeviceBufferRequest r3 = Vmm(*b, 4096, 0, 512);
  r3.allocation_id = 12;
  auto i3 = reg_.Register(1, std::move(r3));
  ASSERT_TRUE(i3.ok()) << i3.status();
  EXPECT_EQ(reg_.Resolve(1, *i3, 0, 4, "send")->ptr, *b);
  EXPECT_EQ(reg_.Stats(1).mappings, 2u);
  if (DeviceBufferRegistry::CanCompareOpenFiles()) {
    DeviceBufferRequest lie = Vmm(*b, 4096, 0, 512);
    lie.allocation_id = 11;  // b's file under a's id
    auto bad = reg_.Register(1, std::move(lie));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("allocation_id"), std::string::npos) << bad.status();
  }
}

TEST_F(DeviceBuffersTest, LegacyHandleOfTheSameAllocationHitsTheCache) {
  auto a = dev_.Allocate(1, 4096);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reg_.Register(3, Legacy(*a, i * 512, 512, 1)).ok());
  EXPECT_EQ(dev_.imports(), 1);
  EXPECT_EQ(reg_.Stats(3).buffers, 5u);
}

TEST_F(DeviceBuffersTest, SessionEndUnmapsEverythingAndClosesEvents) {
  const int events_before = dev_.live_events();
  auto a = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  auto c = dev_.Allocate(1, 4096);
  ASSERT_TRUE(reg_.Register(5, Legacy(*a, 0, 100)).ok());
  ASSERT_TRUE(reg_.Register(5, Legacy(*c, 0, 100, 1)).ok());
  ASSERT_TRUE(reg_.Register(5, Vmm(*a, 4096, 0, 100)).ok());
  auto ev = dev_.CreateEvent(0, true);
  auto id = reg_.RegisterEvent(5, 0, *dev_.ExportEvent(*ev));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(dev_.live_mappings(), 3);
  EXPECT_EQ(dev_.live_events(), events_before + 2);
  reg_.EndSession(5);  // the client died
  EXPECT_EQ(dev_.live_mappings(), 0);
  EXPECT_EQ(dev_.live_events(), events_before + 1);  // only the client's own event remains
  EXPECT_EQ(reg_.node_mappings(), 0u);
  EXPECT_FALSE(reg_.Resolve(5, kDeviceBufferIdBit | 1, 0, 1, "send").ok());
  reg_.EndSession(5);  // idempotent
}

TEST_F(DeviceBuffersTest, RejectsBadRequests) {
  auto a = dev_.Allocate(0, 4096, device::AllocSharing::kPosixFd);
  DeviceBufferRequest r = Legacy(*a, 0, 4096);
  r.device = 2;
  EXPECT_NE(reg_.Register(1, std::move(r)).status().message().find("device"), std::string::npos);
  EXPECT_EQ(reg_.Register(1, Legacy(*a, 0, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  auto beyond = reg_.Register(1, Legacy(*a, 4000, 200));
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find("outside the allocation"), std::string::npos);
  EXPECT_EQ(dev_.live_mappings(), 0);  // the failed registration did not keep its mapping
  DeviceBufferRequest wrong_dev = Legacy(*a, 0, 16);
  wrong_dev.device = 1;  // the handle names device 0
  EXPECT_FALSE(reg_.Register(1, std::move(wrong_dev)).ok());
  DeviceBufferRequest kind = Legacy(*a, 0, 16);
  kind.kind = static_cast<HandleKind>(9);
  EXPECT_NE(reg_.Register(1, std::move(kind)).status().message().find("handle_kind"),
            std::string::npos);
  DeviceBufferRequest nofd = Vmm(*a, 4096, 0, 16);
  nofd.fd.Reset();
  EXPECT_NE(reg_.Register(1, std::move(nofd)).status().message().find("fd"), std::string::npos);
  EXPECT_FALSE(reg_.Register(1, Vmm(*a, 1024, 512, 1024)).ok());  // past the claimed allocation
  EXPECT_FALSE(reg_.Register(1, Vmm(*a, 1 << 20, 0, 16)).ok());    // claims more than exported
  DeviceBufferRequest garbage;
  garbage.kind = HandleKind::kLegacyIpc;
  garbage.device = 0;
  garbage.size_bytes = 16;
  garbage.handle.fill(0xAB);
  EXPECT_FALSE(reg_.Register(1, std::move(garbage)).ok());
  EXPECT_EQ(dev_.live_mappings(), 0);
}

TEST_F(DeviceBuffersTest, LimitsAreCheckedBeforeImporting) {
  DeviceBufferLimits lim;
  lim.max_mappings_per_session = 2;
  lim.max_buffers_per_session = 3;
  lim.max_node_mappings = 3;
  lim.max_mapped_bytes_per_session = 3 * 4096;
  DeviceBufferRegistry reg(&dev_, lim);
  std::vector<device::DevicePtr> allocs;
  for (int i = 0; i < 4; ++i) allocs.push_back(*dev_.Allocate(0, 4096));
  ASSERT_TRUE(reg.Register(1, Legacy(allocs[0], 0, 16)).ok());
  ASSERT_TRUE(reg.Register(1, Legacy(allocs[1], 0, 16)).ok());
  const int imports = dev_.imports();
  auto third = reg.Register(1, Legacy(allocs[2], 0, 16));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("mappings per session"), std::string::npos);
  EXPECT_EQ(dev_.imports(), imports);  // refused before importing
  ASSERT_TRUE(reg.Register(1, Legacy(allocs[0], 16, 16)).ok());  // a cache hit still fits
  EXPECT_NE(reg.Register(1, Legacy(allocs[0], 32, 16)).status().message().find("buffers per session"),
            std::string::npos);
  ASSERT_TRUE(reg.Register(2, Legacy(allocs[2], 0, 16)).ok());
  EXPECT_NE(reg.Register(2, Legacy(allocs[3], 0, 16)).status().message().find("on this node"),
            std::string::npos);
  DeviceBufferLimits small;
  small.max_mapped_bytes_per_session = 1024;
  DeviceBufferRegistry reg2(&dev_, small);
  EXPECT_EQ(reg2.Register(1, Legacy(allocs[3], 0, 16)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reg2.Stats(1).mappings, 0u);
}

TEST_F(DeviceBuffersTest, SessionsAreIsolated) {
  auto a = dev_.Allocate(0, 4096);
  auto id = reg_.Register(1, Legacy(*a, 0, 4096));
  ASSERT_TRUE(id.ok());
  EXPECT_FALSE(reg_.Resolve(2, *id, 0, 16, "send").ok());
  EXPECT_EQ(reg_.Free(2, *id).code(), absl::StatusCode::kNotFound);
  auto r = reg_.Resolve(1, *id, 4000, 200, "recv");
  EXPECT_NE(r.status().message().find("recv.offset_bytes"), std::string::npos);
}

TEST_F(DeviceBuffersTest, PoolRangesAreBuffersWithoutImports) {
  auto pool = device::DevicePool::Create(&dev_, {0}, 1 << 20);
  ASSERT_TRUE(pool.ok());
  auto r1 = (*pool)->Allocate(4, 0, 1000);
  auto r2 = (*pool)->Allocate(4, 0, 1000);
  ASSERT_TRUE(r1.ok() && r2.ok());
  device::DevicePool* p = pool->get();
  auto b1 = reg_.RegisterOwned(4, 0, r1->ptr, r1->bytes,
                               [p, off = r1->offset] { (void)p->Free(4, 0, off); });
  auto b2 = reg_.RegisterOwned(4, 0, r2->ptr, r2->bytes,
                               [p, off = r2->offset] { (void)p->Free(4, 0, off); });
  ASSERT_TRUE(b1.ok() && b2.ok());
  EXPECT_EQ(dev_.imports(), 0);
  auto range = reg_.Resolve(4, *b2, 8, 16, "recv");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->ptr, r2->ptr + 8);
  ASSERT_TRUE(reg_.Free(4, *b1).ok());
  EXPECT_EQ(p->used_bytes(0), r2->bytes);  // given back to the pool
  reg_.EndSession(4);
  EXPECT_EQ(p->used_bytes(0), r2->bytes);  // `range` (an operation) still uses it
  range->keep.reset();
  EXPECT_EQ(p->used_bytes(0), 0u);
}

TEST_F(DeviceBuffersTest, CompletionEventsOnePerRingSlotReachTheClient) {
  const int before = dev_.live_events();
  auto handles = reg_.CompletionEvents(6, 1, 8);
  ASSERT_TRUE(handles.ok()) << handles.status();
  ASSERT_EQ(handles->size(), 8u);
  EXPECT_EQ(dev_.live_events(), before + 8);
  auto again = reg_.CompletionEvents(6, 1, 8);  // idempotent: the same events
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *handles);
  EXPECT_FALSE(reg_.CompletionEvents(6, 1, 16).ok());
  EXPECT_FALSE(reg_.CompletionEvents(6, 1, 5000).ok());
  EXPECT_FALSE(reg_.CompletionEventFor(6, 0, 1).ok());  // none on device 0
  // The daemon records op 11's slot (11 % 8 = 3); the client, which opened
  // handle 3, sees exactly that record.
  auto ev = reg_.CompletionEventFor(6, 1, 11);
  ASSERT_TRUE(ev.ok());
  auto client_view = dev_.ImportEvent(1, (*handles)[3]);
  auto other_slot = dev_.ImportEvent(1, (*handles)[4]);
  ASSERT_TRUE(client_view.ok() && other_slot.ok());
  auto stream = dev_.CreateStream(1, device::StreamPriority::kDefault);
  std::promise<void> gate;
  auto f = gate.get_future().share();
  ASSERT_TRUE(dev_.EnqueueHostFn(*stream, [f] { f.wait(); return absl::OkStatus(); }).ok());
  ASSERT_TRUE(dev_.RecordEvent(*ev, *stream).ok());
  EXPECT_FALSE(*dev_.EventDone(*client_view));
  EXPECT_TRUE(*dev_.EventDone(*other_slot));
  gate.set_value();
  dev_.SyncStream(*stream);
  EXPECT_TRUE(*dev_.EventDone(*client_view));
  dev_.DestroyEvent(*client_view);
  dev_.DestroyEvent(*other_slot);
  reg_.EndSession(6);
  EXPECT_EQ(dev_.live_events(), before);
}

class ResolveOperandsTest : public DeviceBuffersTest {
 protected:
  void SetUp() override {
    base0_ = *dev_.Allocate(0, 8192);
    base1_ = *dev_.Allocate(1, 8192);
    buf0_ = *reg_.Register(1, Legacy(base0_, 0, 8192));
    buf1_ = *reg_.Register(1, Legacy(base1_, 0, 8192, 1));
    ev_ = *dev_.CreateEvent(0, true);
    event_id_ = *reg_.RegisterEvent(1, 0, *dev_.ExportEvent(ev_));
  }
  shm::OpDescriptor Desc(Collective c, uint64_t send, uint64_t recv, uint64_t count) {
    shm::OpDescriptor d{};
    d.collective = static_cast<uint8_t>(c);
    d.dtype = static_cast<uint8_t>(DataType::kFloat32);
    d.count = count;
    d.send = {send, 0};
    d.recv = {recv, 0};
    return d;
  }
  device::DevicePtr base0_ = 0, base1_ = 0;
  uint64_t buf0_ = 0, buf1_ = 0, event_id_ = 0;
  device::EventHandle ev_ = 0;
};

TEST_F(ResolveOperandsTest, ResolvesBuffersAndTheProducerEvent) {
  shm::OpDescriptor d = Desc(Collective::kAllReduce, buf0_, buf0_, 256);
  d.recv.offset_bytes = 4096;
  d.flags = shm::kFlagWaitEvent;
  d.event_id = event_id_;
  auto ops = ResolveDeviceOperands(reg_, 1, d, 1024, 1024, 0, true);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->send.ptr, base0_);
  EXPECT_EQ(ops->recv.ptr, base0_ + 4096);
  EXPECT_EQ(ops->send.device, 0);
  EXPECT_NE(ops->wait_event, 0u);
}

TEST_F(ResolveOperandsTest, RejectsWhatDoesNotFit) {
  shm::OpDescriptor d = Desc(Collective::kAllReduce, buf0_, buf0_, 256);
  EXPECT_FALSE(ResolveDeviceOperands(reg_, 1, d, 1024, 1024, 0, /*device_memory=*/false).ok());
  shm::OpDescriptor mixed = Desc(Collective::kAllReduce, buf0_, 1, 256);  // recv: a host buffer id
  EXPECT_NE(ResolveDeviceOperands(reg_, 1, mixed, 1024, 1024, 0, true).status().message().find(
                "host buffer"),
            std::string::npos);
  shm::OpDescriptor devs = Desc(Collective::kAllReduce, buf0_, buf1_, 256);
  EXPECT_FALSE(ResolveDeviceOperands(reg_, 1, devs, 1024, 1024, 0, true).ok());
  shm::OpDescriptor overlap = Desc(Collective::kAllReduce, buf0_, buf0_, 256);
  overlap.recv.offset_bytes = 512;  // overlaps, not in place
  EXPECT_NE(ResolveDeviceOperands(reg_, 1, overlap, 1024, 1024, 0, true).status().message().find(
                "in-place"),
            std::string::npos);
  shm::OpDescriptor ag = Desc(Collective::kAllGather, buf0_, buf0_, 256);
  ag.send.offset_bytes = 1024;  // rank 1's slice of the gathered buffer: in place
  EXPECT_TRUE(ResolveDeviceOperands(reg_, 1, ag, 1024, 2048, 1, true).ok());
  shm::OpDescriptor big = Desc(Collective::kAllReduce, buf0_, buf0_, 4096);
  EXPECT_FALSE(ResolveDeviceOperands(reg_, 1, big, 16384, 16384, 0, true).ok());
  shm::OpDescriptor ev_dev = Desc(Collective::kAllReduce, buf1_, buf1_, 256);
  ev_dev.flags = shm::kFlagWaitEvent;
  ev_dev.event_id = event_id_;  // the event is on device 0
  EXPECT_NE(ResolveDeviceOperands(reg_, 1, ev_dev, 1024, 1024, 0, true).status().message().find(
                "event_id"),
            std::string::npos);
  shm::OpDescriptor stray = Desc(Collective::kAllReduce, buf0_, buf0_, 256);
  stray.event_id = 3;
  EXPECT_FALSE(ResolveDeviceOperands(reg_, 1, stray, 1024, 1024, 0, true).ok());
  shm::OpDescriptor unknown_ev = Desc(Collective::kAllReduce, buf0_, buf0_, 256);
  unknown_ev.flags = shm::kFlagWaitEvent;
  unknown_ev.event_id = 99;
  EXPECT_FALSE(ResolveDeviceOperands(reg_, 1, unknown_ev, 1024, 1024, 0, true).ok());
}

}  // namespace
}  // namespace hsdp
