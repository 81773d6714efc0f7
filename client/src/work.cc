#include "hsdp/work.h"

#include "arena.h"
#include "channel.h"

namespace hsdp {

bool Work::Test() {
  if (state_ == nullptr || state_->done.load(std::memory_order_acquire)) return true;
  if (state_->arena != nullptr) return state_->arena->Poll(state_.get());
  return state_->channel->Poll(state_.get());
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (state_ == nullptr) return absl::FailedPreconditionError("Wait() on an empty Work");
  if (state_->done.load(std::memory_order_acquire)) return state_->status;
  if (state_->arena != nullptr) return state_->arena->Wait(state_.get(), timeout);
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
  // Host memory only: no completion event, nothing for the stream to wait on.
  if (state_->arena != nullptr || state_->channel == nullptr) return Wait(timeout);
  return state_->channel->WaitOnStream(state_.get(), stream_wait, timeout);
}

uint64_t Work::exec_ns() const {
  return state_ && state_->done.load(std::memory_order_acquire) ? state_->exec_ns : 0;
}

}  // namespace hsdp
