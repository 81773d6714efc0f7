// What a group's deadline check decides, over explicit inputs: which
// partially matched operations waited longer than the matching timeout,
// whether the next sequence number should fail because no member submitted
// it while later operations wait, and whether an unmatched send or receive
// or a running operation is past its deadline. One timeout bounds them all
// (GroupSpec::timeout_ns): something is past it when it began strictly more
// than timeout_ns before now_ns. The time is always passed in; nothing here
// reads a clock. The group acts on the answers (Group::CheckTimeouts): it
// fails, notifies and aborts.
//
// Thread-safety: immutable after construction; the functions that read an
// OpMatcher need the same lock as the matcher (its owner's).
#ifndef HSDP_DAEMON_DATAPLANE_OP_DEADLINES_H_
#define HSDP_DAEMON_DATAPLANE_OP_DEADLINES_H_

#include <cstdint>
#include <vector>

#include "daemon/dataplane/op_matcher.h"

namespace hsdp {

class OpDeadlines {
 public:
  explicit OpDeadlines(int64_t timeout_ns) : timeout_ns_(timeout_ns) {}

  int64_t timeout_ns() const { return timeout_ns_; }
  // The timeout in whole milliseconds, as messages name it.
  int64_t timeout_ms() const { return timeout_ns_ / 1000000; }

  // Whether something that began at `since_ns` is past the timeout at
  // `now_ns`: a running operation (since it started), an unmatched send or
  // receive (since it first entered the daemon).
  bool Expired(int64_t since_ns, int64_t now_ns) const { return now_ns - since_ns > timeout_ns_; }

  // The operations in `matcher` that waited too long at `now_ns`, in (epoch,
  // seq) order: those still missing a local member's submission, and
  // complete ones queued for an epoch that has not started (they wait for
  // the members to join it, bounded by the same timeout). Complete
  // operations of the current epoch wait only for their turn: never listed.
  std::vector<OpMatcher::Key> ExpiredOps(const OpMatcher& matcher, int64_t now_ns) const;

  // Whether the next sequence number to run should fail as never submitted:
  // operations wait behind it (OpMatcher::NextMissing) and the oldest of the
  // current epoch's first entered the daemon too long ago.
  bool NextNeverSubmitted(const OpMatcher& matcher, int64_t now_ns) const;

 private:
  const int64_t timeout_ns_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_OP_DEADLINES_H_
