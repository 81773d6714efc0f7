// The table of a group's partially matched collective operations: the local
// members' submissions of one operation meet here, keyed by (epoch, sequence
// number), until every local member's is in and the operation is taken out
// to run, in sequence order, or it fails.
//
// Rules:
// - It sequences one epoch at a time (the group's current one: StartEpoch
//   when the group enters the next). Sequence numbers start at 1; next_seq()
//   is the next one to run. Operations of the next epoch may queue before it
//   starts; their window counts from 1.
// - A submission is admitted (Check) only inside the window: not 0, not one
//   that already ran, at most max_pending ahead of the next one to run, and
//   while fewer than max_pending operations wait (a submission to one that
//   waits already is always admitted).
// - A sequence number of the current epoch that failed keeps its status
//   (the last 4096 are remembered), so late submissions of it get the same
//   answer; the next-to-run number moves past failed ones (SkipFailed).
// - Submissions are stored by local index: memory follows the members that
//   submitted, never the (client-chosen) size of the group. A member
//   submitting the same operation twice is refused (kDuplicate).
// - Whether the members agree, what the errors say about the group, the
//   epochs' lifecycle and the deadlines are the group's (agreement.h,
//   group.h, op_deadlines.h), not this table's.
//
// Thread-safety: none. Its owner (Group) calls it only under its own mutex.
#ifndef HSDP_DAEMON_DATAPLANE_OP_MATCHER_H_
#define HSDP_DAEMON_DATAPLANE_OP_MATCHER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/dataplane/arrival.h"

namespace hsdp {

// One collective operation of a group, as its local members' submissions
// come in.
struct PendingOp {
  uint32_t epoch = 1;
  uint64_t seq = 0;
  // By local index: only what arrived.
  std::map<int, Arrival> arrivals;
  int arrived = 0;       // submissions counted towards the match
  int64_t first_ns = 0;  // the earliest of their first_ns
};

class OpMatcher {
 public:
  using Key = std::pair<uint32_t, uint64_t>;  // (epoch, seq)

  // What Add did with a submission.
  enum class Added {
    kWaiting,     // stored; other local members' submissions are missing
    kAllArrived,  // stored; it was the last local member's
    kDuplicate,   // not stored: that member already submitted the operation
    kRejected,    // stored, not counted (its `rejected` is not OK): fail the operation
  };

  // `group_id` only names the group in messages; `local_members`: how many
  // submissions make an operation complete.
  OpMatcher(uint32_t group_id, int local_members, uint32_t max_pending, uint32_t epoch);

  // The epoch being sequenced, and the next sequence number of it to run.
  uint32_t epoch() const { return epoch_; }
  uint64_t next_seq() const { return next_seq_; }
  int local_members() const { return local_members_; }
  // Operations waiting (all epochs).
  size_t size() const { return pending_.size(); }
  const std::map<Key, PendingOp>& ops() const { return pending_; }
  // The operation (epoch, seq), or null.
  const PendingOp* Find(Key key) const;

  // Starts sequencing `epoch` from 1, forgetting the failures of the last
  // one. Operations queued for it stay.
  void StartEpoch(uint32_t epoch);

  // Whether (epoch, seq) is in the current epoch's window: from the next one
  // to run to max_pending ahead of it.
  bool InWindow(uint32_t epoch, uint64_t seq) const;
  // OK when a submission of (epoch, seq) may be added; else what its member
  // hears: the status it failed with, a number that already ran or is out of
  // the window, or too many operations waiting. `epoch` is the current one
  // or the next (the group checks that).
  absl::Status Check(uint32_t epoch, uint64_t seq) const;
  // Adds `arrival` (Check passed) as local member `local_index`'s submission
  // of (arrival.epoch, arrival.seq); `*op` (when not null) is set to the
  // operation, valid until the table next changes. kDuplicate leaves
  // `arrival` untouched.
  Added Add(int local_index, Arrival& arrival, const PendingOp** op = nullptr);

  // Moves the next sequence number to run past those that failed.
  void SkipFailed();
  // The next operation of the current epoch to run, taken out of the table,
  // when every local member's submission is in (the next sequence number
  // moves on); nullopt otherwise.
  std::optional<PendingOp> TakeReady();

  // Takes (epoch, seq) out of the table (if there) and returns its
  // submissions to notify; in the current epoch it also remembers `status`
  // for late submissions.
  std::vector<Arrival> Fail(Key key, const absl::Status& status);
  // Fails every operation of `epoch` (in sequence order) and returns their
  // submissions; `*ops` (when not null) is set to how many operations failed.
  std::vector<Arrival> FailEpoch(uint32_t epoch, const absl::Status& status,
                                 size_t* ops = nullptr);
  // Takes `session`'s submissions out of the operations queued for an epoch
  // that has not started (the others' stay queued; an operation left empty
  // goes) and returns them.
  std::vector<Arrival> TakeQueued(const Session* session);

  // Whether operations wait while the next sequence number to run has no
  // submission and has not failed (no member submitted it, yet).
  bool NextMissing() const;
  // When the oldest operation of `epoch` that waits first entered the
  // daemon; nullopt when none waits.
  std::optional<int64_t> OldestFirstNs(uint32_t epoch) const;
  // Records that the next sequence number to run failed with `status` (no
  // member submitted it in time), so the operations behind it can run.
  void FailNext(const absl::Status& status);

  static constexpr size_t kMaxRememberedFailures = 4096;

 private:
  const uint32_t group_id_;
  const int local_members_;
  const uint32_t max_pending_;
  uint32_t epoch_;
  uint64_t next_seq_ = 1;
  std::map<Key, PendingOp> pending_;
  // Failed sequence numbers of the current epoch.
  std::map<uint64_t, absl::Status> failed_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_OP_MATCHER_H_
