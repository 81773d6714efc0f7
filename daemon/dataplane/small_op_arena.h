// The daemon's side of a group's small-operation arena (hsdp/shm/arena.h):
// creates the sealed memfd with its header, hands its fd out (the session
// manager sends it to each member), and marks it broken when the group's
// epoch fails, so members waiting in it fail at once. The daemon never reads
// what the members write there, except the lanes' `consumed` counters for a
// metric (OpsCompleted).
//
// Memory: every arena reserves its bytes from the node's arena pool
// (data_plane.small_op_arena_mib), charged to the job's owner within its
// share (limits.uid_share_percent), and gives them back when the daemon's
// last reference goes (the group and its members' pending replies). At that
// moment the memory itself is released too (shm::RetireArena, then the pages
// are punched out of the memfd): a member that kept its fd or mapping holds
// an empty file, and whatever it writes there afterwards is its own memory,
// charged to it, not to hsdpd.
#ifndef HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
#define HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/session/shm_channel.h"
#include "daemon/util/uid_share.h"
#include "hsdp/shm/arena.h"

namespace hsdp {

// The node's arena memory, in bytes, with a share per uid.
using ArenaBudget = UidSharedPool;
std::shared_ptr<ArenaBudget> NewArenaBudget(uint64_t bytes, uint32_t uid_share_percent);

class SmallOpArena {
 public:
  // An arena for `members` members, `slots` operations in flight and up to
  // `slot_bytes` input bytes per member (shm::ValidArenaGeometry), used in
  // group epoch `epoch` only, charged to `owner_uid` (the job's owner).
  // RESOURCE_EXHAUSTED when `budget` or the owner's share of it has too
  // little left (the group then runs without one).
  static absl::StatusOr<std::shared_ptr<SmallOpArena>> Create(
      uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
      std::shared_ptr<ArenaBudget> budget, uint32_t owner_uid);
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
  uint32_t owner_uid_ = 0;
  uint64_t charged_ = 0;  // bytes taken from budget_
  std::shared_ptr<ArenaBudget> budget_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
