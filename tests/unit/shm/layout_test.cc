// The shared-memory ABI: struct sizes and offsets are part of the contract
// between separately built daemons and trainers.
#include "hsdp/shm/layout.h"

#include <unistd.h>

#include <cstddef>

#include "daemon/session/shm_channel.h"
#include "gtest/gtest.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::shm {
namespace {

TEST(LayoutTest, FixedSizesAndAlignment) {
  EXPECT_EQ(sizeof(Doorbell), 64u);
  EXPECT_EQ(alignof(Doorbell), 64u);
  EXPECT_EQ(sizeof(OpDescriptor), 192u);
  EXPECT_EQ(sizeof(Completion), 256u);
  EXPECT_EQ(alignof(Completion), 64u);
  EXPECT_EQ(sizeof(BufRef), 16u);
  EXPECT_EQ(sizeof(DataHello), 40u);
  EXPECT_EQ(sizeof(DataHelloReply), 256u);
  EXPECT_EQ(sizeof(FdMessage), 16u);
  // Producer and consumer indices live on separate cache lines.
  EXPECT_EQ(offsetof(ChannelHeader, head) % 64, 0u);
  EXPECT_EQ(offsetof(ChannelHeader, tail) % 64, 0u);
  EXPECT_NE(offsetof(ChannelHeader, head) / 64, offsetof(ChannelHeader, tail) / 64);
  // The daemon-written sleep flag shares no cache line with the client's index.
  EXPECT_EQ(offsetof(ChannelHeader, daemon_sleeping) % 64, 0u);
  EXPECT_NE(offsetof(ChannelHeader, head) / 64, offsetof(ChannelHeader, daemon_sleeping) / 64);
}

TEST(LayoutTest, OpDescriptorFieldOffsetsAreStable) {
  EXPECT_EQ(offsetof(OpDescriptor, op_id), 0u);
  EXPECT_EQ(offsetof(OpDescriptor, seq), 8u);
  EXPECT_EQ(offsetof(OpDescriptor, seq2), 16u);
  EXPECT_EQ(offsetof(OpDescriptor, count), 24u);
  EXPECT_EQ(offsetof(OpDescriptor, send), 32u);
  EXPECT_EQ(offsetof(OpDescriptor, recv), 48u);
  EXPECT_EQ(offsetof(OpDescriptor, premul_factor), 64u);
  EXPECT_EQ(offsetof(OpDescriptor, group_id), 88u);
  EXPECT_EQ(offsetof(OpDescriptor, collective), 100u);
  EXPECT_EQ(offsetof(OpDescriptor, reduce_dtype), 103u);
  EXPECT_EQ(offsetof(OpDescriptor, flags), 104u);
  EXPECT_EQ(offsetof(OpDescriptor, epoch), 108u);
  EXPECT_EQ(offsetof(OpDescriptor, epoch2), 112u);
  EXPECT_EQ(offsetof(OpDescriptor, peer), 116u);
  EXPECT_EQ(offsetof(OpDescriptor, tag), 120u);
  EXPECT_EQ(offsetof(OpDescriptor, event_id), 128u);
  EXPECT_EQ(offsetof(OpDescriptor, splits), 136u);
  EXPECT_EQ(offsetof(OpDescriptor, reserved1), 152u);
}

TEST(LayoutTest, ComputeChannelLayoutIsPageAlignedAndDisjoint) {
  for (uint32_t n : {16u, 1024u, 65536u}) {
    const ChannelLayout l = ComputeChannelLayout(n);
    EXPECT_EQ(l.ring_offset % 4096, 0u) << n;
    EXPECT_EQ(l.completion_offset % 4096, 0u) << n;
    EXPECT_EQ(l.total_bytes % 4096, 0u) << n;
    EXPECT_GE(l.ring_offset, sizeof(ChannelHeader));
    EXPECT_GE(l.completion_offset, l.ring_offset + uint64_t{n} * sizeof(OpDescriptor)) << n;
    EXPECT_GE(l.total_bytes, l.completion_offset + uint64_t{n} * sizeof(Completion)) << n;
  }
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignUp(0, 64), 0u);
}

TEST(LayoutTest, ChannelHeaderRecordsVersionAndSizes) {
  auto ch = hsdp::ShmChannel::Create(42, 64);
  ASSERT_TRUE(ch.ok()) << ch.status();
  const auto* h = static_cast<const ChannelHeader*>((*ch)->region().data());
  EXPECT_EQ(h->magic, kChannelMagic);
  EXPECT_EQ(h->version, kLayoutVersion);
  EXPECT_EQ(h->header_bytes, sizeof(ChannelHeader));
  EXPECT_EQ(h->descriptor_bytes, sizeof(OpDescriptor));
  EXPECT_EQ(h->completion_bytes, sizeof(Completion));
  EXPECT_EQ(h->doorbell_bytes, sizeof(Doorbell));
  EXPECT_EQ(h->ring_entries, 64u);
  EXPECT_EQ(h->session_id, 42u);
  const ChannelLayout l = ComputeChannelLayout(64);
  EXPECT_EQ(h->ring_offset, l.ring_offset);
  EXPECT_EQ(h->completion_offset, l.completion_offset);
  EXPECT_EQ(h->total_bytes, l.total_bytes);
  EXPECT_EQ((*ch)->region().bytes(), l.total_bytes);
  EXPECT_EQ(h->state.load(), kChannelOpen);
  EXPECT_EQ(h->head.load(), 0u);
  EXPECT_EQ(h->tail.load(), 0u);
}

TEST(LayoutTest, NewChannelsAskForAWakeUpAndRecordFeatures) {
  auto ch = hsdp::ShmChannel::Create(7, 16, kFeatureEpochs);
  ASSERT_TRUE(ch.ok()) << ch.status();
  const auto* h = static_cast<const ChannelHeader*>((*ch)->region().data());
  EXPECT_EQ(h->features, kFeatureEpochs);
  // Until the dispatcher has seen the ring, the client must kick it.
  EXPECT_EQ(h->daemon_sleeping.load(), 1u);
  (*ch)->SetDaemonSleeping(false);
  EXPECT_EQ(h->daemon_sleeping.load(), 0u);
}

TEST(LayoutTest, WakeFdWakesAWaiterAndAFloodIsHarmless) {
  auto w = hsdp::WakeFd::Create();
  ASSERT_TRUE(w.ok()) << w.status();
  const int64_t t0 = NowNanos();
  (*w)->Wait(20'000'000);  // nothing pending: times out
  EXPECT_GE(NowNanos() - t0, 15'000'000);
  // A client saturating the counter cannot block wake-ups: it stays readable.
  const uint64_t huge = ~uint64_t{0} - 1;
  ASSERT_EQ(::write((*w)->fd(), &huge, sizeof(huge)), 8);
  (*w)->Wake();  // EAGAIN inside, ignored
  const int64_t t1 = NowNanos();
  (*w)->Wait(5'000'000'000);
  EXPECT_LT(NowNanos() - t1, 1'000'000'000);
}

TEST(LayoutTest, RingEntriesMustBeAPowerOfTwo) {
  EXPECT_EQ(hsdp::ShmChannel::Create(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hsdp::ShmChannel::Create(1, 24).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(hsdp::ShmChannel::Create(1, 16).ok());
}

}  // namespace
}  // namespace hsdp::shm
