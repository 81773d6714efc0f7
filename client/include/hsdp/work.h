// hsdp::Work — the handle of one queued collective. A cheap, copyable value:
// copies share the operation's state.
#ifndef HSDP_WORK_H_
#define HSDP_WORK_H_

#include <cstdint>
#include <functional>
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

  // The daemon's id of the operation; 0 for one the group's members ran
  // among themselves in its small-operation arena (docs/architecture.md).
  uint64_t op_id() const;
  // Daemon-side timings of the ended operation (0 while pending, and for an
  // arena operation): time from
  // the first member's arrival to the start of execution, and execution time.
  uint64_t queued_ns() const;
  uint64_t exec_ns() const;
  // A finished receive: the group rank the data came from (useful with
  // kAnySource); -1 otherwise.
  int peer() const;

  // Device path: the id of the completion event the daemon recorded when
  // this operation finished (Client::GetCompletionEvents names it; k is
  // element k - 1), or 0 (host buffers, no completion events requested, not
  // finished, failed).
  uint64_t completion_event_id() const;
  // Makes the application's stream wait for this operation: waits on the CPU
  // (up to `timeout`) for its completion record, then — when it carries a
  // completion event — calls `stream_wait(event_id)`, which must enqueue a
  // wait on that event on the stream (cudaStreamWaitEvent on the handle the
  // application opened from GetCompletionEvents). Returns the operation's
  // status, or the callback's error. Today the daemon writes the record once
  // the device work is done, so the CPU wait is not avoided yet (docs/gpu.md).
  // The completion event is one per ring slot: from before the CPU wait until
  // the callback returns, this client does not submit the op that would
  // reuse it (another thread's Submit waits), so the stream wait captures
  // this op's record and never a later op's. The callback must not submit on
  // this client. Called after a later op already reused the slot, it skips
  // the callback (the op is done; the event is no longer its).
  using StreamWaitFn = std::function<absl::Status(uint64_t completion_event_id)>;
  absl::Status WaitOnStream(const StreamWaitFn& stream_wait,
                            absl::Duration timeout = absl::InfiniteDuration());

 private:
  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace hsdp

#endif  // HSDP_WORK_H_
