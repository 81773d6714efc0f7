#include "channel.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::internal {
namespace {

constexpr int64_t kLivenessSliceNs = 100'000'000;  // re-check the daemon every 100 ms

absl::Status LayoutMismatch(const char* field, uint64_t got, uint64_t want) {
  return absl::FailedPreconditionError(
      absl::StrCat("hsdpd's shared-memory layout differs from this client's: ", field, " is ",
                   got, ", this client expects ", want,
                   " (daemon and client library are from different versions)"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<SessionChannel>> SessionChannel::Map(
    UniqueFd channel_fd, uint64_t channel_bytes, UniqueFd wake_fd, UniqueFd data_conn,
    uint64_t session_id, uint64_t features) {
  std::shared_ptr<SessionChannel> ch(new SessionChannel());
  ch->data_conn_ = std::move(data_conn);
  ch->wake_fd_ = std::move(wake_fd);
  ch->session_id_ = session_id;
  struct stat st;
  if (::fstat(channel_fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError("hsdpd sent a session channel that is not a memfd");
  }
  if (channel_bytes < sizeof(shm::ChannelHeader) || channel_bytes > uint64_t(st.st_size)) {
    return LayoutMismatch("channel size", channel_bytes, static_cast<uint64_t>(st.st_size));
  }
  void* m = ::mmap(nullptr, channel_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, channel_fd.get(), 0);
  if (m == MAP_FAILED) return ErrnoStatus(errno, "mmap(session channel)", __FILE__, __LINE__);
  ch->channel_map_ = m;
  ch->channel_bytes_ = channel_bytes;

  auto* h = static_cast<shm::ChannelHeader*>(ch->channel_map_);
  if (h->magic != shm::kChannelMagic) return LayoutMismatch("channel magic", h->magic, shm::kChannelMagic);
  if (h->version != shm::kLayoutVersion) return LayoutMismatch("layout version", h->version, shm::kLayoutVersion);
  if (h->header_bytes != sizeof(shm::ChannelHeader)) return LayoutMismatch("sizeof(ChannelHeader)", h->header_bytes, sizeof(shm::ChannelHeader));
  if (h->descriptor_bytes != sizeof(shm::OpDescriptor)) return LayoutMismatch("sizeof(OpDescriptor)", h->descriptor_bytes, sizeof(shm::OpDescriptor));
  if (h->completion_bytes != sizeof(shm::Completion)) return LayoutMismatch("sizeof(Completion)", h->completion_bytes, sizeof(shm::Completion));
  if (h->doorbell_bytes != sizeof(shm::Doorbell)) return LayoutMismatch("sizeof(Doorbell)", h->doorbell_bytes, sizeof(shm::Doorbell));
  const uint32_t n = h->ring_entries;
  if (n == 0 || (n & (n - 1)) != 0 || n > (1u << 20)) {
    return LayoutMismatch("ring_entries (a power of two up to 2^20)", n, 1024);
  }
  const shm::ChannelLayout layout = shm::ComputeChannelLayout(n);
  if (h->ring_offset != layout.ring_offset || h->completion_offset != layout.completion_offset ||
      h->total_bytes != layout.total_bytes || channel_bytes < layout.total_bytes) {
    return LayoutMismatch("channel size", channel_bytes, layout.total_bytes);
  }
  if (h->session_id != session_id) return LayoutMismatch("session id", h->session_id, session_id);
  if (h->features != features) return LayoutMismatch("features", h->features, features);

  ch->header_ = h;
  ch->ring_ = reinterpret_cast<shm::OpDescriptor*>(static_cast<char*>(ch->channel_map_) + layout.ring_offset);
  ch->completions_ = reinterpret_cast<shm::Completion*>(static_cast<char*>(ch->channel_map_) + layout.completion_offset);
  ch->entries_ = n;
  {
    absl::MutexLock l(&ch->mu_);
    ch->slot_pins_.assign(n, 0);
  }
  return ch;
}

SessionChannel::~SessionChannel() {
  if (channel_map_ != nullptr) ::munmap(channel_map_, channel_bytes_);
}

uint32_t SessionChannel::SpinMode() const {
  const uint32_t mode = header_->spin_mode.load(std::memory_order_relaxed);
  return mode <= shm::kMaxSpinMode ? mode : shm::kSpinYield;
}

void SessionChannel::KickDaemon() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->daemon_sleeping.load(std::memory_order_seq_cst) != 0) {
    const uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof(one));  // EAGAIN: already pending
    (void)ignored;
  }
}

absl::Status SessionChannel::CheckAlive() {
  if (header_->state.load(std::memory_order_acquire) != shm::kChannelOpen) {
    return absl::UnavailableError("hsdpd ended this session (daemon shutting down or session expired)");
  }
  struct pollfd pfd{data_conn_.get(), POLLIN | POLLRDHUP, 0};
  if (::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN))) {
    char byte;
    if ((pfd.revents & POLLIN) && ::recv(data_conn_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
      return absl::OkStatus();  // unexpected data, not a hang-up
    }
    return absl::UnavailableError("lost the connection to hsdpd (daemon exited or was killed)");
  }
  return absl::OkStatus();
}

bool SessionChannel::HarvestLocked(WorkState* w) {
  shm::Completion& c = completions_[w->op_id & (entries_ - 1)];
  if (c.op_id.load(std::memory_order_acquire) != w->op_id) return false;
  const uint32_t len = std::min<uint32_t>(c.message_len, sizeof(c.message));
  const auto code = static_cast<absl::StatusCode>(c.code);
  w->status = code == absl::StatusCode::kOk ? absl::OkStatus()
                                            : absl::Status(code, std::string(c.message, len));
  w->queued_ns = c.queued_ns;
  w->exec_ns = c.exec_ns;
  w->peer = c.peer;
  w->event_id = c.event_id;
  w->done.store(true, std::memory_order_release);
  return true;
}

absl::StatusOr<Work> SessionChannel::Submit(shm::OpDescriptor desc, bool composite) {
  absl::MutexLock submit_lock(&submit_mu_);
  {
    absl::MutexLock l(&mu_);
    if (!closed_.ok()) return closed_;
  }
  const uint64_t op_id = next_op_id_;
  // The slot's previous user must have completed; take its result first.
  if (op_id > entries_) {
    const uint64_t prev = op_id - entries_;
    shm::Completion& c = completions_[op_id & (entries_ - 1)];
    while (c.op_id.load(std::memory_order_acquire) != prev) {
      RETURN_IF_ERROR(CheckAlive());
      shm::AwaitDoorbell(
          &header_->client_bell,
          [&] { return c.op_id.load(std::memory_order_acquire) == prev; }, spin_ns_,
          shm::NowNanos() + kLivenessSliceNs, SpinMode());
    }
    // Not while a WaitOnStream of `prev` still has to enqueue its stream
    // wait: this op's completion event is prev's.
    const uint64_t slot = op_id & (entries_ - 1);
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](uint32_t* pins) { return *pins == 0; }, &slot_pins_[slot]));
    auto it = pending_.find(prev);
    if (it != pending_.end()) {
      if (auto w = it->second.lock(); w != nullptr && !w->done.load()) HarvestLocked(w.get());
      pending_.erase(prev);
    }
    pushed_through_ = std::max(pushed_through_, op_id);
  }
  desc.op_id = op_id;
  // Point-to-point matches in posting order and takes no sequence number.
  const auto kind = static_cast<Collective>(desc.collective);
  if (kind != Collective::kSend && kind != Collective::kRecv) {
    desc.seq = ++next_seq_[(uint64_t{desc.group_id} << 32) | desc.epoch];
  }
  if (composite) desc.seq2 = ++next_seq_[(uint64_t{desc.group2_id} << 32) | desc.epoch2];
  auto state = std::make_shared<WorkState>();
  state->channel = shared_from_this();
  state->op_id = op_id;
  {
    absl::MutexLock l(&mu_);
    pending_[op_id] = state;
    pushed_through_ = std::max(pushed_through_, op_id);
  }
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  ring_[head & (entries_ - 1)] = desc;
  header_->head.store(head + 1, std::memory_order_release);
  KickDaemon();
  ++next_op_id_;
  return Work(std::move(state));
}

bool SessionChannel::Poll(WorkState* w) {
  if (w->done.load(std::memory_order_acquire)) return true;
  shm::Completion& c = completions_[w->op_id & (entries_ - 1)];
  if (c.op_id.load(std::memory_order_acquire) != w->op_id) return false;
  absl::MutexLock l(&mu_);
  if (w->done.load(std::memory_order_acquire)) return true;
  if (!HarvestLocked(w)) return false;
  pending_.erase(w->op_id);
  return true;
}

absl::Status SessionChannel::Wait(WorkState* w, absl::Duration timeout) {
  const int64_t deadline = timeout == absl::InfiniteDuration()
                               ? -1
                               : shm::NowNanos() + absl::ToInt64Nanoseconds(timeout);
  for (;;) {
    int64_t slice_end = shm::NowNanos() + kLivenessSliceNs;
    if (deadline >= 0 && deadline < slice_end) slice_end = deadline;
    if (shm::AwaitDoorbell(&header_->client_bell, [&] { return Poll(w); }, spin_ns_, slice_end,
                           SpinMode())) {
      return w->status;
    }
    if (absl::Status alive = CheckAlive(); !alive.ok()) {
      // The session ended, but this op's completion may have been written just
      // before (a drain fails the ops in flight with its reason, then ends the
      // sessions): one last look, so the op's own reason wins over the generic one.
      if (Poll(w)) return w->status;
      Close(alive);
      if (w->done.load(std::memory_order_acquire)) return w->status;
      return alive;
    }
    if (deadline >= 0 && shm::NowNanos() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("op ", w->op_id, " still pending after ", absl::FormatDuration(timeout)));
    }
  }
}

absl::Status SessionChannel::WaitOnStream(WorkState* w, const Work::StreamWaitFn& stream_wait,
                                          absl::Duration timeout) {
  const uint64_t slot = w->op_id & (entries_ - 1);
  bool pinned = false;
  {
    absl::MutexLock l(&mu_);
    if (pushed_through_ < w->op_id + entries_) {  // the slot's next op is not pushed
      ++slot_pins_[slot];
      pinned = true;
    }
  }
  absl::Status s = w->done.load(std::memory_order_acquire) ? w->status : Wait(w, timeout);
  if (s.ok() && pinned && stream_wait && w->event_id != 0) s = stream_wait(w->event_id);
  if (pinned) {
    absl::MutexLock l(&mu_);
    --slot_pins_[slot];
  }
  return s;
}

absl::Status SessionChannel::Health() {
  {
    absl::MutexLock l(&mu_);
    if (!closed_.ok()) return closed_;
  }
  return CheckAlive();
}

void SessionChannel::Close(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  if (closed_.ok()) closed_ = why;
  for (auto& [op_id, weak] : pending_) {
    if (auto w = weak.lock(); w != nullptr && !w->done.load()) {
      if (!HarvestLocked(w.get())) {
        w->status = why;
        w->done.store(true, std::memory_order_release);
      }
    }
  }
  pending_.clear();
}

}  // namespace hsdp::internal
