// A member's side of its group's small-operation arena (hsdp/shm/arena.h):
// small all-reduce, all-gather, reduce-scatter, broadcast and barrier on host
// buffers, run by the members themselves in shared memory, with no hand-off
// to the daemon.
//
//   Submit   copies the input into this member's area of the operation's
//            slot and publishes it (waiting first, bounded, until every
//            member has finished reading the slot's previous operation);
//            then spins briefly for the others, so an operation whose peers
//            are already there completes before Submit returns.
//   Complete once every member published: checks that they all submitted the
//            same operation, writes this member's output (reductions in rank
//            order with the daemon's kernels: the daemon's results, bit for
//            bit), publishes that it is done with the slot. Operations
//            complete in submission order (Poll, Wait, Drain).
//
// Failures: the daemon marks the arena broken when the group's epoch fails
// (a member's session ended): every operation fails with its status. An
// operation still waiting at its deadline (timeouts.collective_ms) breaks the
// arena for every member (DEADLINE_EXCEEDED): the members' sequences can no
// longer be trusted to agree. A member that leaves the arena (Close: it
// reconnected to a new daemon, rejoined or detached) breaks it with its
// reason. Either way the group's later operations fail until the members call
// RejoinGroup (or reconnect), which gives them the daemon's path or a new
// arena; each operation's outcome is the same at every member (settling,
// hsdp/shm/arena.h).
//
// Thread-safety: all methods are thread-safe (one mutex; a waiting
// operation holds it, so operations of one group complete one at a time, in
// order).
#ifndef HSDP_CLIENT_SRC_ARENA_H_
#define HSDP_CLIENT_SRC_ARENA_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/shm/arena.h"
#include "hsdp/types.h"
#include "hsdp/work.h"

namespace hsdp::internal {

struct WorkState;

// One operation as the arena runs it (arguments already checked).
struct ArenaOp {
  Collective collective = Collective::kInvalid;
  DataType dtype = DataType::kInvalid;
  uint64_t count = 0;
  ReduceOptions reduce;
  int root = 0;
  const void* send = nullptr;  // this member's input (in a mapped buffer)
  void* recv = nullptr;        // this member's output
};

class GroupArena : public std::enable_shared_from_this<GroupArena> {
 public:
  // Maps an arena the daemon sent (`bytes` as NewGroup said) for group rank
  // `rank` of a group whose global ranks are `ranks` (for messages).
  // `daemon_gone` says why the session's daemon went away, or OK (long
  // waits ask it every 100 ms).
  // FAILED_PRECONDITION when its header is not one this build runs (version,
  // geometry, size).
  static absl::StatusOr<std::shared_ptr<GroupArena>> Map(UniqueFd fd, uint64_t bytes,
                                                         std::vector<int> ranks, int rank,
                                                         absl::Duration op_timeout,
                                                         int64_t spin_ns, uint32_t spin_mode,
                                                         std::function<absl::Status()> daemon_gone);
  ~GroupArena();
  GroupArena(const GroupArena&) = delete;
  GroupArena& operator=(const GroupArena&) = delete;

  // Whether `collective` with `count` elements of `dtype` per member runs
  // here: the same answer at every member for the same operation.
  bool Takes(Collective collective, uint64_t count, DataType dtype) const;
  // Not OK once broken or closed (why).
  absl::Status Health() const;

  absl::StatusOr<Work> Submit(const ArenaOp& op) ABSL_LOCKS_EXCLUDED(mu_);
  // Work support (w->arena is this arena).
  bool Poll(WorkState* w) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(WorkState* w, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Completes every operation submitted so far (before an operation of the
  // group goes to the daemon, or a buffer is freed). Returns the first
  // failure's status.
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // Breaks the arena for every member with `why` (hsdpd went away: each
  // member's operations fail, and they go on in their new sessions).
  void Fail(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // This member leaves the arena (the client detached, reconnected or
  // rejoined): the pending operations every member submitted complete if
  // they can still commit, then the arena breaks with `why` for every member
  // and the rest fail, here and at the others alike; every later operation
  // fails with `why`. Nothing is written to any buffer after Close returns.
  void Close(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Pending {
    uint64_t seq = 0;
    shm::ArenaSlotHeader key{};
    void* recv = nullptr;
    int64_t deadline_ns = 0;
    std::shared_ptr<WorkState> work;
  };

  GroupArena() = default;
  shm::ArenaLane* lane(int m) const;
  // Member m's area in the slot of operation `seq`.
  unsigned char* area(uint64_t seq, int m) const;
  // Non-OK when broken (the daemon's or a member's code) or closed.
  absl::Status BrokenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Breaks the arena for every member with `why`'s code.
  void Break(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the oldest pending operation, waiting until `deadline_ns`
  // (NowNanos scale; the operation's own deadline is also honoured).
  // Returns false when it is still incomplete at `deadline_ns`.
  bool CompleteFrontLocked(int64_t deadline_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides `p` (popped from pending_) when it can be decided now, the same
  // way at every member (hsdp/shm/arena.h, "Settling"): completes it when it
  // commits, fails it when the arena froze first. With `freeze`, or when the
  // arena is broken, freezes the arena first, so `p` is always decided.
  // False: undecided (every input not in yet, the arena healthy).
  bool SettleLocked(Pending& p, bool freeze) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `ready()` or `until_ns` (returns ready() then); breaks the
  // arena when the daemon went away meanwhile.
  bool AwaitLocked(const std::function<bool()>& ready, int64_t until_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every member published operation `seq`.
  bool AllArrived(uint64_t seq) const;
  // Whether every member finished reading operation `seq`.
  bool AllConsumed(uint64_t seq) const;
  void Finish(Pending& p, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Execute(const Pending& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Disagreement(const shm::ArenaSlotHeader& mine, int my_rank,
                            const shm::ArenaSlotHeader& theirs, int their_rank) const;
  // "[a, b]": the global ranks of the group ranks whose lane is (or is not,
  // `arrived` false) at operation `seq`.
  std::string RanksAt(uint64_t seq, bool arrived) const;

  UniqueFd fd_;
  void* map_ = nullptr;
  uint64_t bytes_ = 0;
  shm::ArenaHeader* header_ = nullptr;
  // The geometry as checked at Map (never read from the header again).
  uint32_t slots_ = 1;
  uint64_t slot_bytes_ = 0;
  shm::ArenaLayout layout_{};
  int members_ = 0;
  int rank_ = 0;
  std::vector<int> ranks_;
  int64_t op_timeout_ns_ = 0;
  int64_t spin_ns_ = 0;
  uint32_t spin_mode_ = 0;
  std::function<absl::Status()> daemon_gone_;

  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  // Whether one of this member's operations already failed because the
  // arena broke (Submit).
  bool break_seen_ ABSL_GUARDED_BY(mu_) = false;
  // The break this member last read from the header: after hsdpd released
  // the arena (its words read as zeros) it still says why it broke.
  mutable absl::Status broken_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp::internal

#endif  // HSDP_CLIENT_SRC_ARENA_H_
