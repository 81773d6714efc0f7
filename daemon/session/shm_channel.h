// Daemon side of a session's shared-memory channel, and the node page.
//
// The daemon creates the memfd, initialises the header and keeps its own
// copies of every layout value and of the consumer index: nothing it needs
// to stay safe is ever read back from shared memory, which the client can
// scribble on.
#ifndef HSDP_DAEMON_SESSION_SHM_CHANNEL_H_
#define HSDP_DAEMON_SESSION_SHM_CHANNEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

// A sealed, shared memfd mapping owned by the daemon. Not copyable. Its
// pages are released when it is destroyed, even where a client still holds
// the fd or a mapping (they then read zeros), unless KeepPages was called.
class SharedRegion {
 public:
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(const char* name, uint64_t bytes);
  ~SharedRegion();
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }
  // The daemon is stopping: its destruction leaves the pages to whoever
  // still maps them (the kernel frees them with the last mapping). A client
  // still reading what the daemon wrote last (a completion) reads it, not
  // zeros; the daemon's accounting ends with it anyway.
  void KeepPages() { keep_pages_ = true; }

 private:
  SharedRegion() = default;
  UniqueFd fd_;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool keep_pages_ = false;
};

// The dispatcher's wake-up: a non-blocking eventfd. Every session's client
// holds a write-only use of it (it can only make the daemon look at the
// rings: a flood costs the daemon a wake-up, never a lost one, because the
// eventfd stays readable while its counter is non-zero).
class WakeFd {
 public:
  static absl::StatusOr<std::unique_ptr<WakeFd>> Create();
  int fd() const { return fd_.get(); }
  // Wakes the waiter. Thread-safe, never blocks.
  void Wake() const;
  // Sleeps until woken or `timeout_ns` passes (< 0: no timeout), then
  // clears pending wake-ups.
  void Wait(int64_t timeout_ns) const;

 private:
  UniqueFd fd_;
};

// Thread-safety: Pop/HasWork from one consumer thread only (the
// dispatcher); Complete and Close from any thread.
class ShmChannel {
 public:
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Create(uint64_t session_id,
                                                            uint32_t ring_entries,
                                                            uint64_t features = shm::kFeaturesRequired);

  enum class PopResult { kEmpty, kOk, kCorrupt };
  // Copies the next descriptor out of the ring (so later client writes can't
  // change what was validated). kCorrupt when the client's head index is
  // impossible; the caller should end the session.
  PopResult Pop(shm::OpDescriptor* out);
  bool HasWork() const;

  // Writes the completion record for `op_id` (message truncated to fit) and
  // rings the client's doorbell.
  // `peer`: for a receive, the group rank the data came from; else -1.
  // `event_id`: the device completion event recorded for it (slot + 1), or 0.
  void Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns,
                int32_t peer = -1, uint64_t event_id = 0);

  // Tells the client the session is over (its waits fail fast).
  void Close();

  // Publishes whether the dispatcher may sleep (the client then kicks the
  // WakeFd after a push). Written, never read back.
  void SetDaemonSleeping(bool sleeping);
  // Publishes how the client's spinning waits share a CPU (shm::SpinMode).
  void SetSpinMode(uint32_t mode);

  const SharedRegion& region() const { return *region_; }
  // SharedRegion::KeepPages (the daemon is stopping).
  void KeepPages() { region_->KeepPages(); }
  uint32_t ring_entries() const { return entries_; }

 private:
  std::unique_ptr<SharedRegion> region_;
  shm::ChannelHeader* header_ = nullptr;
  shm::OpDescriptor* ring_ = nullptr;
  shm::Completion* completions_ = nullptr;
  uint32_t entries_ = 0;
  uint64_t tail_ = 0;  // authoritative consumer index (mirrored to header_->tail)
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_SHM_CHANNEL_H_
