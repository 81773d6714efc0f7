#include "hsdp/work.h"

#include "channel.h"

namespace hsdp {

bool Work::Test() {
  if (state_ == nullptr) return true;
  return state_->channel->Poll(state_.get());
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (state_ == nullptr) return absl::FailedPreconditionError("Wait() on an empty Work");
  if (state_->done.load(std::memory_order_acquire)) return state_->status;
  return state_->channel->Wait(state_.get(), timeout);
}

absl::Status Work::status() const {
  if (state_ == nullptr) return absl::FailedPreconditionError("empty Work");
  if (!state_->done.load(std::memory_order_acquire)) return absl::UnavailableError("pending");
  return state_->status;
}

uint64_t Work::op_id() const { return state_ ? state_->op_id : 0; }
uint64_t Work::queued_ns() const {
  return state_ && state_->done.load(std::memory_order_acquire) ? state_->queued_ns : 0;
}
int Work::peer() const {
  return state_ && state_->done.load(std::memory_order_acquire) ? state_->peer : -1;
}
uint64_t Work::completion_event_id() const {
  return state_ && state_->done.load(std::memory_order_acquire) && state_->status.ok()
             ? state_->event_id
             : 0;
}

absl::Status Work::WaitOnStream(const StreamWaitFn& stream_wait, absl::Duration timeout) {
  if (state_ == nullptr) return absl::FailedPreconditionError("WaitOnStream() on an empty Work");
  return state_->channel->WaitOnStream(state_.get(), stream_wait, timeout);
}

uint64_t Work::exec_ns() const {
  return state_ && state_->done.load(std::memory_order_acquire) ? state_->exec_ns : 0;
}

}  // namespace hsdp
