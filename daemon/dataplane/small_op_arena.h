// The daemon's side of a group's small-operation arena (hsdp/shm/arena.h):
// creates the sealed memfd with its header, hands its fd out (the session
// manager sends it to each member), and marks it broken when the group's
// epoch fails, so members waiting in it fail at once. The daemon never reads
// what the members write there, except the lanes' `consumed` counters for a
// metric (OpsCompleted).
//
// Memory: every arena reserves its bytes from the node's arena pool
// (data_plane.small_op_arena_mib), charged to the job's owner within its
// share (limits.uid_share_percent), and gives them back when the memory
// itself is released (shm::RetireArena, then the pages are punched out of
// the memfd): a member that kept its fd or mapping holds an empty file, and
// whatever it writes there afterwards is its own memory, charged to it, not
// to hsdpd.
//
// When the daemon's last reference goes (the group ended: its job's last
// session, or the daemon is stopping), the arena is broken first, so nothing
// commits any more, and released only once every member has finished every
// operation that was committed (each lane's `consumed` reached the settle
// word), or after a grace period (ArenaReaper). Releasing it at once would
// take the inputs away from a member still reading an operation the others
// completed: that member would fail it where they succeeded, and the job's
// ranks would leave the arena out of step (a drain for an upgrade did this).
#ifndef HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
#define HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/shm_channel.h"
#include "daemon/util/uid_share.h"
#include "hsdp/shm/arena.h"

namespace hsdp {

// The node's arena memory, in bytes, with a share per uid.
using ArenaBudget = UidSharedPool;
std::shared_ptr<ArenaBudget> NewArenaBudget(uint64_t bytes, uint32_t uid_share_percent);

class SmallOpArena;
// An arena's memory and its charge: a SmallOpArena's, then its reaper's
// until released (small_op_arena.cc).
struct ArenaMemory;

// Arenas the daemon is done with, held until their members have finished
// what was committed (above). Thread-safe.
class ArenaReaper {
 public:
  // An arena is released at the latest `grace` after the daemon let it go.
  explicit ArenaReaper(absl::Duration grace);
  ~ArenaReaper();  // releases whatever is left
  ArenaReaper(const ArenaReaper&) = delete;
  ArenaReaper& operator=(const ArenaReaper&) = delete;

  // Releases every held arena that is due: all its members consumed every
  // committed operation, or its grace passed. Never blocks.
  void Reap();
  // Releases every held arena once it is due, waiting at most `bound` (the
  // daemon is stopping); then the rest regardless.
  void ReapAll(absl::Duration bound);
  size_t held() const;

 private:
  friend class SmallOpArena;
  void Hold(std::unique_ptr<ArenaMemory> m);
  const absl::Duration grace_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<ArenaMemory>> held_ ABSL_GUARDED_BY(mu_);
};

class SmallOpArena {
 public:
  // An arena for `members` members, `slots` operations in flight and up to
  // `slot_bytes` input bytes per member (shm::ValidArenaGeometry), used in
  // group epoch `epoch` only, charged to `owner_uid` (the job's owner).
  // RESOURCE_EXHAUSTED when `budget` or the owner's share of it has too
  // little left (the group then runs without one).
  static absl::StatusOr<std::shared_ptr<SmallOpArena>> Create(
      uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
      std::shared_ptr<ArenaBudget> budget, uint32_t owner_uid,
      std::shared_ptr<ArenaReaper> reaper = nullptr);
  // Breaks the arena (ABORTED: the group ended) unless it is broken already,
  // then hands it to the reaper; without one, releases it at once.
  ~SmallOpArena();

  int fd() const;
  uint64_t bytes() const;
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
  SmallOpArena();
  std::unique_ptr<ArenaMemory> mem_;
  uint32_t epoch_ = 0;
  std::shared_ptr<ArenaReaper> reaper_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_SMALL_OP_ARENA_H_
