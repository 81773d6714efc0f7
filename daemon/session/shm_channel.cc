#include "daemon/session/shm_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(const char* name,
                                                                   uint64_t bytes) {
  std::unique_ptr<SharedRegion> r(new SharedRegion());
  r->fd_.Reset(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!r->fd_.valid()) return ErrnoStatus(errno, "memfd_create", __FILE__, __LINE__);
  SYSCALL_OR_RETURN(::ftruncate(r->fd_.get(), static_cast<off_t>(bytes)));
  if (int rc = ::posix_fallocate(r->fd_.get(), 0, static_cast<off_t>(bytes)); rc != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes for ", name, ": ", std::strerror(rc)));
  }
  SYSCALL_OR_RETURN(::fcntl(r->fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_.get(), 0);
  if (m == MAP_FAILED) return ErrnoStatus(errno, "mmap", __FILE__, __LINE__);
  r->data_ = m;
  r->bytes_ = bytes;
  return r;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  // A client may keep its fd or mapping of the memfd after the daemon is done
  // with it: the pages go now anyway (the file keeps its size, reads as
  // zeros), so memory hsdpd handed out never outlives its accounting. What a
  // client writes there afterwards is its own memory, charged to it.
  if (fd_.valid() && bytes_ > 0 && !keep_pages_) {
    (void)::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                      static_cast<off_t>(bytes_));
  }
}

absl::StatusOr<std::unique_ptr<WakeFd>> WakeFd::Create() {
  auto w = std::make_unique<WakeFd>();
  w->fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!w->fd_.valid()) return ErrnoStatus(errno, "eventfd", __FILE__, __LINE__);
  return w;
}

void WakeFd::Wake() const {
  const uint64_t one = 1;
  ssize_t ignored = ::write(fd_.get(), &one, sizeof(one));  // EAGAIN: already pending
  (void)ignored;
}

void WakeFd::Wait(int64_t timeout_ns) const {
  struct pollfd pfd{fd_.get(), POLLIN, 0};
  int timeout_ms = -1;
  if (timeout_ns >= 0) timeout_ms = static_cast<int>((timeout_ns + 999'999) / 1'000'000);
  if (::poll(&pfd, 1, timeout_ms) > 0) {
    uint64_t v;
    ssize_t ignored = ::read(fd_.get(), &v, sizeof(v));
    (void)ignored;
  }
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Create(uint64_t session_id,
                                                               uint32_t ring_entries,
                                                               uint64_t features) {
  if (ring_entries == 0 || (ring_entries & (ring_entries - 1)) != 0) {
    return absl::InvalidArgumentError("ring_entries must be a power of two");
  }
  const shm::ChannelLayout layout = shm::ComputeChannelLayout(ring_entries);
  auto ch = std::unique_ptr<ShmChannel>(new ShmChannel());
  ASSIGN_OR_RETURN(ch->region_, SharedRegion::Create("hsdp:channel", layout.total_bytes));
  char* base = static_cast<char*>(ch->region_->data());
  auto* h = new (base) shm::ChannelHeader();
  h->magic = shm::kChannelMagic;
  h->version = shm::kLayoutVersion;
  h->header_bytes = sizeof(shm::ChannelHeader);
  h->descriptor_bytes = sizeof(shm::OpDescriptor);
  h->completion_bytes = sizeof(shm::Completion);
  h->doorbell_bytes = sizeof(shm::Doorbell);
  h->ring_entries = ring_entries;
  h->session_id = session_id;
  h->ring_offset = layout.ring_offset;
  h->completion_offset = layout.completion_offset;
  h->total_bytes = layout.total_bytes;
  h->features = features;
  h->state.store(shm::kChannelOpen);
  h->daemon_sleeping.store(1);  // until the dispatcher first looks at this ring
  ch->header_ = h;
  ch->ring_ = reinterpret_cast<shm::OpDescriptor*>(base + layout.ring_offset);
  ch->completions_ = reinterpret_cast<shm::Completion*>(base + layout.completion_offset);
  for (uint32_t i = 0; i < ring_entries; ++i) new (&ch->completions_[i]) shm::Completion();
  ch->entries_ = ring_entries;
  return ch;
}

bool ShmChannel::HasWork() const {
  return header_->head.load(std::memory_order_acquire) != tail_;
}

ShmChannel::PopResult ShmChannel::Pop(shm::OpDescriptor* out) {
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  if (head == tail_) return PopResult::kEmpty;
  if (head - tail_ > entries_) return PopResult::kCorrupt;
  std::memcpy(static_cast<void*>(out), &ring_[tail_ & (entries_ - 1)], sizeof(*out));
  ++tail_;
  header_->tail.store(tail_, std::memory_order_release);
  return PopResult::kOk;
}

void ShmChannel::Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns,
                          uint64_t exec_ns, int32_t peer, uint64_t event_id) {
  shm::Completion& c = completions_[op_id & (entries_ - 1)];
  c.code = static_cast<int32_t>(status.code());
  const absl::string_view msg = status.message();
  const size_t len = std::min(msg.size(), sizeof(c.message));
  // An OK status has no message: data() is null, and memcpy from null is UB
  // even for 0 bytes (UBSan, tests/fuzz/dispatcher_fuzz).
  if (len > 0) std::memcpy(c.message, msg.data(), len);
  c.message_len = static_cast<uint32_t>(len);
  c.queued_ns = queued_ns;
  c.exec_ns = exec_ns;
  c.peer = peer;
  c.event_id = event_id;
  c.op_id.store(op_id, std::memory_order_release);
  shm::RingDoorbell(&header_->client_bell);
}

void ShmChannel::SetDaemonSleeping(bool sleeping) {
  header_->daemon_sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
}

void ShmChannel::SetSpinMode(uint32_t mode) {
  header_->spin_mode.store(mode, std::memory_order_relaxed);
}

void ShmChannel::Close() {
  header_->state.store(shm::kChannelClosed, std::memory_order_release);
  shm::RingDoorbell(&header_->client_bell);
}

}  // namespace hsdp
