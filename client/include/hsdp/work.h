// hsdp::Work — the handle of one queued collective. A cheap, copyable value:
// copies share the operation's state.
#ifndef HSDP_WORK_H_
#define HSDP_WORK_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hsdp {

namespace internal {
struct WorkState;
}

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}

  // True when the operation has ended (successfully or not). Never blocks.
  bool Test();
  // Blocks until the operation ends or `timeout` passes; returns the
  // operation's status, or DEADLINE_EXCEEDED on timeout (the operation goes
  // on; Wait again later). Spins briefly, then sleeps on a futex. Fails with
  // UNAVAILABLE if the daemon goes away meanwhile.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());
  // The status once ended; UNAVAILABLE("pending") before that, and
  // FAILED_PRECONDITION for a default-constructed Work.
  absl::Status status() const;

  uint64_t op_id() const;
  // Daemon-side timings of the ended operation (0 while pending): time from
  // the first member's arrival to the start of execution, and execution time.
  uint64_t queued_ns() const;
  uint64_t exec_ns() const;
  // A finished receive: the group rank the data came from (useful with
  // kAnySource); -1 otherwise.
  int peer() const;

 private:
  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace hsdp

#endif  // HSDP_WORK_H_
