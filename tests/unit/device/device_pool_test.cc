// DevicePool over FakeDeviceApi: ranges carved from one exported allocation,
// alignment, ownership, per-session share, reuse after free, session end.
#include "daemon/device/device_pool.h"

#include "daemon/device/fake_device_api.h"
#include "gtest/gtest.h"

namespace hsdp::device {
namespace {

TEST(DevicePoolTest, RangesComeFromOneAllocationExportedOnce) {
  FakeDeviceApi dev(2, 1 << 22);
  auto pool = DevicePool::Create(&dev, {0, 1}, 1 << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(dev.live_allocations(), 2);
  auto a = (*pool)->Allocate(7, 0, 100);
  auto b = (*pool)->Allocate(7, 0, 1000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes, 512u);  // 512-byte aligned
  EXPECT_EQ(b->offset, 512u);
  EXPECT_EQ(b->ptr, a->ptr + 512);
  EXPECT_EQ(dev.live_allocations(), 2);  // no allocation per buffer
  // A client maps the pool once and sees the same bytes at the same offsets.
  auto fd = (*pool)->Export(0);
  ASSERT_TRUE(fd.ok());
  auto m = dev.ImportFd(0, fd->get(), (*pool)->pool_bytes(0));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ptr + b->offset, b->ptr);
  EXPECT_FALSE((*pool)->Export(5).ok());
}

TEST(DevicePoolTest, OwnershipSharesAndReuse) {
  FakeDeviceApi dev(1, 1 << 22);
  auto pool = *DevicePool::Create(&dev, {0}, 1 << 20, /*max_session_fraction=*/0.5);
  auto a = pool->Allocate(1, 0, 256 << 10);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(pool->Resolve(2, 0, a->offset, 16).ok());  // not session 2's
  EXPECT_TRUE(pool->Resolve(1, 0, a->offset + 100, 1000).ok());
  EXPECT_FALSE(pool->Resolve(1, 0, a->offset + 100, 256 << 10).ok());  // past the range
  EXPECT_EQ(pool->Free(2, 0, a->offset).code(), absl::StatusCode::kNotFound);
  auto over = pool->Allocate(1, 0, 300 << 10);  // beyond session 1's half
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("share"), std::string::npos);
  auto other = pool->Allocate(2, 0, 512 << 10);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(pool->Allocate(4, 0, 256 << 10).ok());
  EXPECT_FALSE(pool->Allocate(3, 0, 512).ok());  // the pool is full
  ASSERT_TRUE(pool->Free(1, 0, a->offset).ok());
  auto again = pool->Allocate(3, 0, 512);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->offset, a->offset);  // the freed range is reused
  pool->EndSession(2);
  EXPECT_EQ(pool->session_bytes(2), 0u);
  EXPECT_EQ(pool->used_bytes(0), 512u + (256u << 10));  // sessions 3 and 4
  EXPECT_FALSE(pool->Allocate(1, 0, 0).ok());
  EXPECT_FALSE(pool->Allocate(1, 3, 16).ok());
}

TEST(DevicePoolTest, CreationFailsCleanly) {
  FakeDeviceApi dev(1, 1 << 20);
  EXPECT_FALSE(DevicePool::Create(&dev, {0}, 2 << 20).ok());  // larger than the device
  EXPECT_FALSE(DevicePool::Create(&dev, {0}, 1 << 10, 0).ok());
  {
    auto pool = DevicePool::Create(&dev, {0}, 1 << 19);
    ASSERT_TRUE(pool.ok());
  }
  EXPECT_EQ(dev.live_allocations(), 0);  // freed with the pool
}

}  // namespace
}  // namespace hsdp::device
