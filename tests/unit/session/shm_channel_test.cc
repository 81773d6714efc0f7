// The daemon's ShmChannel against a separate client-side mapping of the same
// memfd (as a trainer maps it): push/pop, wraparound, completions, close,
// and the corrupt-index guard.
#include "daemon/session/shm_channel.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

using shm::ChannelHeader;
using shm::OpDescriptor;

// A client's view: its own mapping of the channel fd.
class ClientView {
 public:
  explicit ClientView(const SharedRegion& r) : bytes_(r.bytes()) {
    map_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd(), 0);
    EXPECT_NE(map_, MAP_FAILED);
    EXPECT_NE(map_, r.data()) << "the client view must be a separate mapping";
  }
  ~ClientView() { ::munmap(map_, bytes_); }
  ChannelHeader* h() { return static_cast<ChannelHeader*>(map_); }
  void Push(const OpDescriptor& d) {
    const uint64_t head = h()->head.load(std::memory_order_relaxed);
    shm::RingSlots(h())[head & (h()->ring_entries - 1)] = d;
    h()->head.store(head + 1, std::memory_order_release);
  }
  shm::Completion& CompletionFor(uint64_t op_id) {
    return shm::CompletionSlots(h())[op_id & (h()->ring_entries - 1)];
  }

 private:
  void* map_;
  uint64_t bytes_;
};

OpDescriptor Desc(uint64_t op_id) {
  OpDescriptor d{};
  d.op_id = op_id;
  d.seq = op_id * 10;
  d.count = op_id * 3 + 1;
  d.collective = 1;
  d.dtype = 1;
  d.reduce_op = 1;
  d.group_id = 7;
  return d;
}

TEST(ShmChannelTest, PushThenPopInOrder) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok()) << ch.status();
  ClientView client((*ch)->region());
  OpDescriptor out;
  EXPECT_FALSE((*ch)->HasWork());
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kEmpty);
  for (uint64_t i = 1; i <= 5; ++i) client.Push(Desc(i));
  EXPECT_TRUE((*ch)->HasWork());
  for (uint64_t i = 1; i <= 5; ++i) {
    ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
    EXPECT_EQ(out.op_id, i);
    EXPECT_EQ(out.seq, i * 10);
    EXPECT_EQ(out.count, i * 3 + 1);
  }
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kEmpty);
  EXPECT_FALSE((*ch)->HasWork());
  // The consumer index is mirrored for the client.
  EXPECT_EQ(client.h()->tail.load(), 5u);
}

TEST(ShmChannelTest, PopCopiesTheDescriptor) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  client.Push(Desc(1));
  OpDescriptor out;
  ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
  // A later client write to the slot does not change what was popped.
  shm::RingSlots(client.h())[0].count = 999999;
  EXPECT_EQ(out.count, 4u);
}

TEST(ShmChannelTest, WrapsAroundManyTimes) {
  constexpr uint32_t kEntries = 16;
  auto ch = ShmChannel::Create(1, kEntries);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  uint64_t next_push = 1, next_pop = 1;
  OpDescriptor out;
  // Varying batch sizes, including completely full rings, over ~20 laps.
  for (int round = 0; round < 60; ++round) {
    const int batch = 1 + (round * 7) % kEntries;
    for (int i = 0; i < batch; ++i) client.Push(Desc(next_push++));
    for (int i = 0; i < batch; ++i) {
      ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk) << "round " << round;
      ASSERT_EQ(out.op_id, next_pop) << "round " << round;
      ++next_pop;
    }
    ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kEmpty);
  }
  EXPECT_GT(next_pop, uint64_t{kEntries} * 20);
  // A full ring (exactly `entries` outstanding) is legal.
  for (uint32_t i = 0; i < kEntries; ++i) client.Push(Desc(next_push++));
  for (uint32_t i = 0; i < kEntries; ++i) {
    ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
    EXPECT_EQ(out.op_id, next_pop++);
  }
}

TEST(ShmChannelTest, ImpossibleHeadIsCorrupt) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  OpDescriptor out;
  // More than `entries` ahead of the consumer.
  client.h()->head.store(17);
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kCorrupt);
  // Behind the consumer (wraps to a huge distance).
  client.h()->head.store(2);
  ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
  ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
  client.h()->head.store(1);
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kCorrupt);
  client.h()->head.store(~uint64_t{0});
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kCorrupt);
}

TEST(ShmChannelTest, ClientScribblingOnTailDoesNotConfuseTheDaemon) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  client.Push(Desc(1));
  client.Push(Desc(2));
  OpDescriptor out;
  ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
  client.h()->tail.store(12345);  // the daemon keeps its own copy
  ASSERT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kOk);
  EXPECT_EQ(out.op_id, 2u);
  EXPECT_EQ((*ch)->Pop(&out), ShmChannel::PopResult::kEmpty);
}

TEST(ShmChannelTest, CompleteWritesRecordAndRingsClient) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  const uint32_t bell_before = client.h()->client_bell.seq.load();
  (*ch)->Complete(19, absl::InvalidArgumentError("count: bad"), 11, 22);
  shm::Completion& c = client.CompletionFor(19);
  EXPECT_EQ(c.op_id.load(), 19u);
  EXPECT_EQ(c.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(std::string(c.message, c.message_len), "count: bad");
  EXPECT_EQ(c.queued_ns, 11u);
  EXPECT_EQ(c.exec_ns, 22u);
  EXPECT_NE(client.h()->client_bell.seq.load(), bell_before);
  // Messages longer than the record are truncated, never overflow.
  (*ch)->Complete(20, absl::InternalError(std::string(1000, 'x')), 0, 0);
  shm::Completion& c2 = client.CompletionFor(20);
  EXPECT_EQ(c2.message_len, sizeof(c2.message));
  EXPECT_EQ(client.CompletionFor(21).op_id.load(), 0u);
}

// An OK status carries no message (its data() is null): the record gets an
// empty one. Under UBSan (the sanitizer build) this failed as memcpy from
// null; found by tests/fuzz/dispatcher_fuzz.
TEST(ShmChannelTest, CompleteWithOkHasAnEmptyMessage) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  (*ch)->Complete(3, absl::OkStatus(), 0, 0);
  shm::Completion& c = client.CompletionFor(3);
  EXPECT_EQ(c.op_id.load(), 3u);
  EXPECT_EQ(c.code, 0);
  EXPECT_EQ(c.message_len, 0u);
}

TEST(ShmChannelTest, CloseIsVisibleToTheClient) {
  auto ch = ShmChannel::Create(1, 16);
  ASSERT_TRUE(ch.ok());
  ClientView client((*ch)->region());
  EXPECT_EQ(client.h()->state.load(), shm::kChannelOpen);
  (*ch)->Close();
  EXPECT_EQ(client.h()->state.load(), shm::kChannelClosed);
}

TEST(ShmChannelTest, CrossProcessProducer) {
  constexpr uint64_t kOps = 5000;
  auto ch = ShmChannel::Create(1, 64);
  ASSERT_TRUE(ch.ok());
  auto wake = WakeFd::Create();
  ASSERT_TRUE(wake.ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a producer with its own mapping that waits for space.
    void* m = ::mmap(nullptr, (*ch)->region().bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                     (*ch)->region().fd(), 0);
    auto* h = static_cast<ChannelHeader*>(m);
    for (uint64_t i = 1; i <= kOps; ++i) {
      while (h->head.load() - h->tail.load(std::memory_order_acquire) >= h->ring_entries) {
        sched_yield();
      }
      const uint64_t head = h->head.load(std::memory_order_relaxed);
      shm::RingSlots(h)[head & (h->ring_entries - 1)] = Desc(i);
      h->head.store(head + 1, std::memory_order_release);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (h->daemon_sleeping.load() != 0) (*wake)->Wake();
    }
    _exit(0);
  }
  uint64_t expect = 1;
  OpDescriptor out;
  const int64_t deadline = shm::NowNanos() + 20'000'000'000;
  while (expect <= kOps && shm::NowNanos() < deadline) {
    switch ((*ch)->Pop(&out)) {
      case ShmChannel::PopResult::kOk:
        ASSERT_EQ(out.op_id, expect);
        ASSERT_EQ(out.count, expect * 3 + 1);
        ++expect;
        break;
      case ShmChannel::PopResult::kCorrupt:
        FAIL() << "corrupt at " << expect;
      case ShmChannel::PopResult::kEmpty:
        (*ch)->SetDaemonSleeping(true);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (!(*ch)->HasWork()) (*wake)->Wait(10'000'000);
        (*ch)->SetDaemonSleeping(false);
        break;
    }
  }
  EXPECT_EQ(expect, kOps + 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace hsdp
