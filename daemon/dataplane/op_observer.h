// OpObserver: what a Group reports about every operation it sees, for
// metrics, the trace and straggler attribution. A group calls its observer
// (GroupSpec::observer, null = none) at four points:
//
//   OnArrival   a member's submission reached the group (arrived_ns is set);
//               it may still be refused.
//   OnMatched   the last local member of (epoch, seq) arrived and all agree.
//   OnLaunched  the engine ordered the operation.
//   OnCompleted the outcome of an operation for its members: success (just
//               after the members were told, off their latency) or a failure
//               on any path (disagreement, timeout, lost member, refusal; just
//               before). A composite op's first phase reports here when its
//               engine part ends; its second phase reports in the replicate
//               group.
//
// The default implementation does nothing. Thread-safety: called from the
// dispatcher thread and engine threads, mostly with the group's lock held:
// implementations must be thread-safe, must not block, and must never call
// back into a Group.
#ifndef HSDP_DAEMON_DATAPLANE_OP_OBSERVER_H_
#define HSDP_DAEMON_DATAPLANE_OP_OBSERVER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "daemon/dataplane/group.h"

namespace hsdp {

class OpObserver {
 public:
  virtual ~OpObserver() = default;

  virtual void OnArrival(const GroupSpec& /*group*/, const Arrival& /*arrival*/) {}
  // `arrivals`: by local member index, every local member's submission.
  virtual void OnMatched(const GroupSpec& /*group*/, const std::map<int, Arrival>& /*arrivals*/) {}
  // `any`: one of the operation's arrivals (names epoch, seq, collective).
  virtual void OnLaunched(const GroupSpec& /*group*/, const Arrival& /*any*/, uint64_t /*ticket*/) {
  }
  // `arrivals`: the members told (one, for a refused submission).
  // `queued_ns`: first arrival to hand-off to the engine; `exec_ns`: engine
  // time (both 0 when the operation never ran).
  virtual void OnCompleted(const GroupSpec& /*group*/, const std::vector<Arrival>& /*arrivals*/,
                           const absl::Status& /*status*/, uint64_t /*queued_ns*/,
                           uint64_t /*exec_ns*/) {}
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_OP_OBSERVER_H_
