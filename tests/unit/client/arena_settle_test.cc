// Settling (hsdp/shm/arena.h): every member of a group reaches the same
// outcome for each small-operation arena operation, whatever breaks the
// arena and whenever. Two members' GroupArenas map one arena the daemon's
// SmallOpArena made, in one process; a member that arrives "too late" is
// played with raw writes to its lane, as a member that passed its check just
// before a break would write them.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "arena.h"
#include "daemon/dataplane/small_op_arena.h"
#include "gtest/gtest.h"
#include "hsdp/shm/arena.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/work.h"

namespace hsdp::internal {
namespace {

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 256;
constexpr uint64_t kCount = 4;

class ArenaSettleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = SmallOpArena::Create(2, kSlots, kSlotBytes, 1, budget_, 0, reaper_);
    ASSERT_TRUE(a.ok()) << a.status();
    daemon_ = *std::move(a);
    for (int r = 0; r < 2; ++r) {
      auto m = GroupArena::Map(UniqueFd(::dup(daemon_->fd())), daemon_->bytes(), {0, 1}, r,
                               absl::Seconds(30), 0, shm::kSpinYield, nullptr);
      ASSERT_TRUE(m.ok()) << m.status();
      member_[r] = *std::move(m);
      for (uint64_t i = 0; i < kCount; ++i) send_[r][i] = float(r + 1) * float(i + 1);
    }
    bytes_ = daemon_->bytes();
    void* map = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED,
                       daemon_->fd(), 0);
    ASSERT_NE(map, MAP_FAILED);
    raw_ = static_cast<unsigned char*>(map);
  }
  void TearDown() override {
    if (raw_ != nullptr) ::munmap(raw_, bytes_);
  }

  absl::StatusOr<Work> AllReduce(int r) {
    ArenaOp op;
    op.collective = Collective::kAllReduce;
    op.dtype = DataType::kFloat32;
    op.count = kCount;
    op.send = send_[r];
    op.recv = recv_[r];
    return member_[r]->Submit(op);
  }
  // Member 1's input for operation `seq` as its client would write it, then
  // its lane's `arrived`: what a member that passed its broken check before
  // a break writes after it.
  void RawArrive(int r, uint64_t seq) {
    const shm::ArenaLayout l = shm::ComputeArenaLayout(2, kSlots, kSlotBytes);
    unsigned char* area =
        raw_ + shm::ArenaAreaOffset(l, 2, static_cast<uint32_t>((seq - 1) % kSlots), r);
    shm::ArenaSlotHeader key{};
    key.seq = seq;
    key.collective = static_cast<uint8_t>(Collective::kAllReduce);
    key.dtype = static_cast<uint8_t>(DataType::kFloat32);
    key.count = kCount;
    key.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    key.premul_factor = ReduceOptions{}.premul_factor;
    key.pre_divide = ReduceOptions{}.pre_divide;
    key.post_divide = ReduceOptions{}.post_divide;
    std::memcpy(area, &key, sizeof(key));
    std::memcpy(area + sizeof(key), send_[r], sizeof(send_[r]));
    auto* lanes = reinterpret_cast<shm::ArenaLane*>(raw_ + l.lanes_offset);
    lanes[r].arrived.store(seq, std::memory_order_release);
    shm::RingDoorbell(&header()->bell);
  }
  shm::ArenaHeader* header() { return reinterpret_cast<shm::ArenaHeader*>(raw_); }
  void ExpectSum(int r) {
    for (uint64_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(recv_[r][i], 3.0f * float(i + 1)) << "member " << r << " element " << i;
    }
  }

  std::shared_ptr<ArenaBudget> budget_ = NewArenaBudget(1 << 20, 100);
  // Never releases an arena by its grace within a test.
  std::shared_ptr<ArenaReaper> reaper_ = std::make_shared<ArenaReaper>(absl::Hours(1));
  std::shared_ptr<SmallOpArena> daemon_;
  std::shared_ptr<GroupArena> member_[2];
  float send_[2][kCount] = {};
  float recv_[2][kCount] = {};
  unsigned char* raw_ = nullptr;
  uint64_t bytes_ = 0;
};

TEST(ArenaSettleWordTest, CommitsRiseUntilTheFreezeAndNothingCommitsAfterIt) {
  shm::ArenaHeader h{};
  EXPECT_FALSE(shm::ArenaFrozen(h));
  EXPECT_TRUE(shm::CommitArenaOp(&h, 1));
  EXPECT_TRUE(shm::CommitArenaOp(&h, 3));
  EXPECT_TRUE(shm::CommitArenaOp(&h, 2));  // a later one was committed: so was this
  shm::FreezeArena(&h);
  EXPECT_TRUE(shm::ArenaFrozen(h));
  EXPECT_TRUE(shm::CommitArenaOp(&h, 3));   // committed before the freeze
  EXPECT_FALSE(shm::CommitArenaOp(&h, 4));  // never
  shm::FreezeArena(&h);
  EXPECT_FALSE(shm::CommitArenaOp(&h, 4));
  EXPECT_TRUE(shm::CommitArenaOp(&h, 1));
}

TEST(ArenaSettleWordTest, BreakingFreezesAfterWritingTheCode) {
  shm::ArenaHeader h{};
  shm::BreakArena(&h, absl::UnavailableError("going"));
  EXPECT_TRUE(shm::ArenaFrozen(h));
  EXPECT_EQ(shm::ArenaBrokenStatus(h).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(shm::CommitArenaOp(&h, 1));
}

// The defect this protocol fixes: a member's input arriving after the
// daemon broke the arena made every input present, so that member's peer
// completed the operation that the member itself (had it looked first)
// failed. Now the break decides it for everyone: it fails.
TEST_F(ArenaSettleTest, InputsCompletedOnlyAfterABreakFailTheOperation) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  EXPECT_FALSE(w0->Test());
  daemon_->MarkBroken(absl::UnavailableError("hsdpd is draining"));
  RawArrive(1, 1);
  const absl::Status s = w0->Wait(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("hsdpd is draining"), std::string::npos) << s;
}

// A member that had every input before anything broke commits the
// operation; a peer that gets to it only after the break completes it too,
// with the same result.
TEST_F(ArenaSettleTest, AnOperationCommittedBeforeABreakCompletesAtEveryMember) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto w1 = AllReduce(1);  // every input in: completes (commits) here and now
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_TRUE(w1->Test());
  ASSERT_TRUE(w1->Wait(absl::Seconds(10)).ok());
  daemon_->MarkBroken(absl::UnavailableError("hsdpd is draining"));
  ASSERT_TRUE(w0->Wait(absl::Seconds(10)).ok()) << w0->status();
  ExpectSum(0);
  ExpectSum(1);
  // The next one fails at both.
  auto n0 = AllReduce(0), n1 = AllReduce(1);
  EXPECT_EQ(n0.ok() ? n0->Wait(absl::Seconds(10)).code() : n0.status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(n1.ok() ? n1->Wait(absl::Seconds(10)).code() : n1.status().code(),
            absl::StatusCode::kUnavailable);
}

// The reconnect case: member 0 leaves the arena (Close) with an operation
// pending that member 1 already completed. Member 0 completes it too (its
// output is written before Close returns), and member 1's next operation
// fails at once with member 0's reason instead of waiting for a member that
// is gone.
TEST_F(ArenaSettleTest, LeavingCompletesWhatAPeerCommittedAndFailsTheRestForEveryone) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok());
  auto w1 = AllReduce(1);
  ASSERT_TRUE(w1.ok());
  ASSERT_TRUE(w1->Wait(absl::Seconds(10)).ok());
  member_[0]->Close(absl::UnavailableError("hsdpd went away; the client reconnected (retry)"));
  ASSERT_TRUE(w0->Test());
  EXPECT_TRUE(w0->status().ok()) << w0->status();
  ExpectSum(0);
  auto n1 = AllReduce(1);
  const absl::Status s = n1.ok() ? n1->Wait(absl::Seconds(10)) : n1.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("reconnected"), std::string::npos) << s;
}

// Member 0 leaves with an operation only it submitted: it fails there, and
// fails alike at member 1, though member 1's input arrives afterwards.
TEST_F(ArenaSettleTest, LeavingFailsAnOperationNotEveryMemberSubmittedAtEveryMember) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok());
  member_[0]->Close(absl::UnavailableError("the client reconnected"));
  ASSERT_TRUE(w0->Test());
  EXPECT_EQ(w0->status().code(), absl::StatusCode::kUnavailable) << w0->status();
  // Through the library: member 1 sees the break before it arrives.
  auto w1 = AllReduce(1);
  const absl::Status s = w1.ok() ? w1->Wait(absl::Seconds(10)) : w1.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // And had it arrived anyway (it passed its check before the break), no
  // member completes it: the settle word froze without it.
  RawArrive(1, 1);
  EXPECT_FALSE(shm::CommitArenaOp(header(), 1));
}

// A leaving member must not touch an arena hsdpd already released (the
// group ended): its pending operation fails, and no page of the emptied
// file comes back.
TEST_F(ArenaSettleTest, ClosingARetiredArenaFailsPendingWorkWithoutWritingIt) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok());
  shm::RetireArena(header());
  const uint64_t settled_before = header()->settled.load();
  const uint32_t broken_before = header()->broken.load();
  member_[0]->Close(absl::CancelledError("the client detached"));
  ASSERT_TRUE(w0->Test());
  EXPECT_EQ(w0->status().code(), absl::StatusCode::kAborted) << w0->status();
  EXPECT_EQ(header()->settled.load(), settled_before);
  EXPECT_EQ(header()->broken.load(), broken_before);
}

// The drain defect (packaging.deb_container): hsdpd ended the group and
// released its arena at once, while member 0 was still to read an operation
// member 1 had completed. Member 0 failed what member 1 completed, and the
// job's ranks went on out of step. The daemon's side now holds the arena
// until every member finished what was committed.
TEST_F(ArenaSettleTest, AnEndedGroupsArenaIsReleasedOnlyOnceEveryMemberFinishedItsCommittedWork) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  auto w1 = AllReduce(1);
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_TRUE(w1->Wait(absl::Seconds(10)).ok());  // committed; member 0 has not looked yet
  const uint64_t charged = budget_->used();
  ASSERT_GT(charged, 0u);
  daemon_->MarkBroken(absl::UnavailableError("hsdpd drained for a restart"));
  daemon_.reset();  // the group ended: the daemon's last reference
  EXPECT_EQ(reaper_->held(), 1u);
  reaper_->Reap();
  EXPECT_EQ(reaper_->held(), 1u) << "released before member 0 finished operation 1";
  EXPECT_FALSE(shm::ArenaRetired(*header()));
  EXPECT_EQ(budget_->used(), charged);
  ASSERT_TRUE(w0->Wait(absl::Seconds(10)).ok()) << w0->status();
  ExpectSum(0);
  ExpectSum(1);
  reaper_->Reap();
  EXPECT_EQ(reaper_->held(), 0u);
  EXPECT_TRUE(shm::ArenaRetired(*header()));
  EXPECT_EQ(budget_->used(), 0u);
}

// A member that never finishes (it died, or stopped) holds the memory no
// longer than the grace, and a stopping daemon waits for it no longer than
// its bound.
TEST_F(ArenaSettleTest, AMemberThatNeverFinishesHoldsTheArenaOnlyUntilTheGraceOrTheBound) {
  auto w0 = AllReduce(0);
  auto w1 = AllReduce(1);
  ASSERT_TRUE(w1.ok() && w1->Wait(absl::Seconds(10)).ok());
  daemon_.reset();
  ASSERT_EQ(reaper_->held(), 1u);
  reaper_->ReapAll(absl::Milliseconds(20));
  EXPECT_EQ(reaper_->held(), 0u);
  EXPECT_TRUE(shm::ArenaRetired(*header()));
  EXPECT_EQ(budget_->used(), 0u);

  auto short_grace = std::make_shared<ArenaReaper>(absl::ZeroDuration());
  auto b = SmallOpArena::Create(2, kSlots, kSlotBytes, 2, budget_, 0, short_grace);
  ASSERT_TRUE(b.ok()) << b.status();
  const uint64_t b_bytes = (*b)->bytes();
  void* b_map = ::mmap(nullptr, b_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*b)->fd(), 0);
  ASSERT_NE(b_map, MAP_FAILED);
  // Committed, and nobody will ever consume it.
  ASSERT_TRUE(shm::CommitArenaOp(static_cast<shm::ArenaHeader*>(b_map), 1));
  b->reset();
  EXPECT_EQ(short_grace->held(), 1u);
  short_grace->Reap();
  EXPECT_EQ(short_grace->held(), 0u);
  EXPECT_EQ(budget_->used(), 0u);
  ::munmap(b_map, b_bytes);
  // Member 0 leaves: its operation, pending all along, fails (the group ended).
  member_[0]->Close(absl::CancelledError("the client detached"));
  ASSERT_TRUE(w0.ok() && w0->Test());
  EXPECT_EQ(w0->status().code(), absl::StatusCode::kAborted) << w0->status();
}

// After hsdpd released an arena its words read as zeros, `broken` too: a
// member still says why it broke (UNAVAILABLE: reconnect, as the daemon
// drained) instead of taking the emptied arena for a healthy one.
TEST_F(ArenaSettleTest, AReleasedArenaStillReadsBrokenWithTheReasonTheMemberSaw) {
  auto w0 = AllReduce(0);
  ASSERT_TRUE(w0.ok());
  daemon_->MarkBroken(absl::UnavailableError("hsdpd drained for a restart"));
  ASSERT_EQ(w0->Wait(absl::Seconds(10)).code(), absl::StatusCode::kUnavailable);
  daemon_.reset();
  reaper_->ReapAll(absl::ZeroDuration());  // released: the pages are punched out
  ASSERT_EQ(header()->broken.load(), 0u);
  ASSERT_TRUE(shm::ArenaRetired(*header()));
  const absl::Status h = member_[0]->Health();
  EXPECT_EQ(h.code(), absl::StatusCode::kUnavailable) << h;
  EXPECT_NE(h.message().find("drained"), std::string::npos) << h;
  auto n0 = AllReduce(0);
  const absl::Status s = n0.ok() ? n0->Wait(absl::Seconds(10)) : n0.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // Member 1 never read the break: the release itself fails its operations
  // (the group ended), never a wait for inputs that are gone.
  auto n1 = AllReduce(1);
  const absl::Status s1 = n1.ok() ? n1->Wait(absl::Seconds(10)) : n1.status();
  EXPECT_EQ(s1.code(), absl::StatusCode::kAborted) << s1;
}

}  // namespace
}  // namespace hsdp::internal
