// Client side of a session's shared-memory channel: maps it, checks its
// header, pushes descriptors and collects completions.
//
// Thread-safety: all methods are thread-safe. `mu_` serialises producers
// (one ring, one producer at a time) and completion harvesting.
#ifndef HSDP_CLIENT_SRC_CHANNEL_H_
#define HSDP_CLIENT_SRC_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/shm/layout.h"
#include "hsdp/work.h"

namespace hsdp::internal {

struct WorkState {
  std::shared_ptr<class SessionChannel> channel;  // null for an arena operation
  // An operation run in the group's small-operation arena (arena.h) instead.
  std::shared_ptr<class GroupArena> arena;
  uint64_t arena_seq = 0;
  uint64_t op_id = 0;
  std::atomic<bool> done{false};
  absl::Status status;  // valid once done
  uint64_t queued_ns = 0;
  uint64_t exec_ns = 0;
  int peer = -1;  // recv: the source group rank
  uint64_t event_id = 0;  // device completion event (slot + 1), 0 = none
};

// A Work that has already failed with `why`.
inline Work FailedWork(const absl::Status& why) {
  auto w = std::make_shared<WorkState>();
  w->status = why;
  w->done.store(true, std::memory_order_release);
  return Work(std::move(w));
}

class SessionChannel : public std::enable_shared_from_this<SessionChannel> {
 public:
  // Maps the channel fd (taking ownership of it, the daemon's wake eventfd
  // and the data connection) and validates the layout: every size the
  // daemon published is checked against this build and against the memfd's
  // real size. FAILED_PRECONDITION on a version or size mismatch.
  static absl::StatusOr<std::shared_ptr<SessionChannel>> Map(UniqueFd channel_fd,
                                                             uint64_t channel_bytes,
                                                             UniqueFd wake_fd,
                                                             UniqueFd data_conn,
                                                             uint64_t session_id,
                                                             uint64_t features);
  ~SessionChannel();

  // Fills op_id and the per-group sequence numbers (seq for group_id, seq2
  // for group2_id when `composite`), pushes, rings the daemon. Blocks while
  // the ring is full (the oldest op's completion slot is still in use).
  absl::StatusOr<Work> Submit(shm::OpDescriptor desc, bool composite);

  // Work support.
  bool Poll(WorkState* w);
  absl::Status Wait(WorkState* w, absl::Duration timeout);
  // Work::WaitOnStream: the completion slot of `w` is pinned (the op that
  // would reuse its completion event is not pushed) from before the CPU
  // wait until `stream_wait` has enqueued the stream wait, so the wait can
  // only capture this op's record. When a later op already reuses the slot,
  // the event is no longer this op's: no stream wait is enqueued (this op's
  // completion record is written after its device work finished).
  absl::Status WaitOnStream(WorkState* w, const Work::StreamWaitFn& stream_wait,
                            absl::Duration timeout);

  // OK while the session lives; otherwise why not (UNAVAILABLE when the
  // daemon ended it or went away).
  absl::Status Health();

  // Marks the channel dead: pending and future ops fail with `why`.
  void Close(const absl::Status& why);
  int data_fd() const { return data_conn_.get(); }
  uint32_t ring_entries() const { return entries_; }
  uint32_t spin_ns() const { return spin_ns_; }
  // The daemon's hint for spinning waits (shm::SpinMode; kSpinYield if it
  // wrote none or nonsense).
  uint32_t SpinMode() const;

 private:
  SessionChannel() = default;
  // Copies slot `op_id`'s completion into `w` if it holds that op.
  bool HarvestLocked(WorkState* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Non-OK when the daemon ended the session or went away.
  absl::Status CheckAlive();
  // Wakes the daemon's dispatcher if it published that it may sleep.
  void KickDaemon();

  void* channel_map_ = nullptr;
  uint64_t channel_bytes_ = 0;
  UniqueFd wake_fd_;
  UniqueFd data_conn_;
  uint64_t session_id_ = 0;
  shm::ChannelHeader* header_ = nullptr;
  shm::OpDescriptor* ring_ = nullptr;
  shm::Completion* completions_ = nullptr;
  uint32_t entries_ = 0;
  uint32_t spin_ns_ = 200000;

  // Lock order: submit_mu_ before mu_. submit_mu_ serialises producers and
  // may be held while waiting for a ring slot; mu_ is never held while waiting.
  absl::Mutex submit_mu_;
  uint64_t next_op_id_ ABSL_GUARDED_BY(submit_mu_) = 1;
  // Next sequence number by (group id << 32 | epoch): restarts in a new epoch.
  std::unordered_map<uint64_t, uint64_t> next_seq_ ABSL_GUARDED_BY(submit_mu_);
  absl::Mutex mu_;
  // Ops pushed and not yet harvested, by op id.
  std::unordered_map<uint64_t, std::weak_ptr<WorkState>> pending_ ABSL_GUARDED_BY(mu_);
  // Per completion slot: WaitOnStream calls that have not enqueued their
  // stream wait yet; Submit does not push an op reusing a pinned slot.
  std::vector<uint32_t> slot_pins_ ABSL_GUARDED_BY(mu_);
  uint64_t pushed_through_ ABSL_GUARDED_BY(mu_) = 0;  // highest op id pushed
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp::internal

#endif  // HSDP_CLIENT_SRC_CHANNEL_H_
