// hsdp::Work — the handle of one queued collective.
#ifndef HSDP_WORK_H_
#define HSDP_WORK_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hsdp {

namespace internal {
class SessionChannel;
}

class Work {
 public:
  Work() = default;

  // True when the operation has ended (successfully or not). Never blocks.
  bool Test();
  // Blocks until the operation ends or `timeout` passes; returns the
  // operation's status, or DEADLINE_EXCEEDED on timeout (the operation goes
  // on; Wait again later). Spins briefly, then sleeps on a futex.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());
  // The status once ended; UNAVAILABLE("pending") before that.
  absl::Status status() const;

  uint64_t op_id() const { return op_id_; }
  // Daemon-side timings of the ended operation (0 while pending).
  uint64_t queued_ns() const { return queued_ns_; }
  uint64_t exec_ns() const { return exec_ns_; }

 private:
  friend class internal::SessionChannel;
  Work(std::shared_ptr<internal::SessionChannel> channel, uint64_t op_id)
      : channel_(std::move(channel)), op_id_(op_id) {}

  std::shared_ptr<internal::SessionChannel> channel_;
  uint64_t op_id_ = 0;
  bool done_ = false;
  absl::Status status_ = absl::UnavailableError("pending");
  uint64_t queued_ns_ = 0;
  uint64_t exec_ns_ = 0;
};

}  // namespace hsdp

#endif  // HSDP_WORK_H_
