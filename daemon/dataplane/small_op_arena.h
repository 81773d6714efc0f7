// The daemon's side of a group's small-operation arena (hsdp/shm/arena.h):
// creates the sealed memfd with its header, hands its fd out (the session
// manager sends it to each member), and marks it broken when the group's
// epoch fails, so members waiting in it fail at once. The daemon never reads
// what the members write there, except the lanes' `consumed` counters for a
// metric (OpsCompleted).
//
// Memory: every arena reserves its bytes from an ArenaBudget shared by the
// node (data_plane.small_op_arena_mib) and gives them back when the last
// reference goes (the group and its members' pending replies).
#ifndef HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
#define HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/shm/arena.h"

namespace hsdp {

// Bytes of arena memory the node may still hand out.
class ArenaBudget {
 public:
  explicit ArenaBudget(uint64_t bytes) : left_(bytes) {}
  // Takes `bytes` if that many are left (atomically).
  bool TryTake(uint64_t bytes);
  void Give(uint64_t bytes) { left_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t left() const { return left_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> left_;
};

class SmallOpArena {
 public:
  // An arena for `members` members, `slots` operations in flight and up to
  // `slot_bytes` input bytes per member (shm::ValidArenaGeometry), used in
  // group epoch `epoch` only. RESOURCE_EXHAUSTED when `budget` has too
  // little left (the group then runs without one).
  static absl::StatusOr<std::shared_ptr<SmallOpArena>> Create(
      uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
      std::shared_ptr<ArenaBudget> budget);
  ~SmallOpArena();

  int fd() const { return region_->fd(); }
  uint64_t bytes() const { return region_->bytes(); }
  uint32_t epoch() const { return epoch_; }
  // Every operation in the arena that not every member submitted fails with
  // `why` from now on (the first call's stays); waiters are woken.
  // Thread-safe, never blocks.
  void MarkBroken(const absl::Status& why);
  bool broken() const;
  // Operations every member finished (the least of the lanes' `consumed`),
  // for metrics only: members write those words, so a member can make only
  // its own job's count wrong.
  uint64_t OpsCompleted() const;

 private:
  SmallOpArena() = default;
  std::unique_ptr<SharedRegion> region_;
  shm::ArenaHeader* header_ = nullptr;
  const shm::ArenaLane* lanes_ = nullptr;
  uint32_t members_ = 0;
  uint32_t epoch_ = 0;
  std::shared_ptr<ArenaBudget> budget_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
