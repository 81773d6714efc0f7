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

// A sealed, shared memfd mapping owned by the daemon. Not copyable.
class SharedRegion {
 public:
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(const char* name, uint64_t bytes);
  ~SharedRegion();
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }

 private:
  SharedRegion() = default;
  UniqueFd fd_;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class NodePage {
 public:
  static absl::StatusOr<std::unique_ptr<NodePage>> Create();
  shm::Doorbell* daemon_bell() { return &page_->daemon_bell; }
  const SharedRegion& region() const { return *region_; }

 private:
  std::unique_ptr<SharedRegion> region_;
  shm::NodePage* page_ = nullptr;
};

// Thread-safety: Pop/HasWork from one consumer thread only (the
// dispatcher); Complete and Close from any thread.
class ShmChannel {
 public:
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Create(uint64_t session_id,
                                                            uint32_t ring_entries);

  enum class PopResult { kEmpty, kOk, kCorrupt };
  // Copies the next descriptor out of the ring (so later client writes can't
  // change what was validated). kCorrupt when the client's head index is
  // impossible; the caller should end the session.
  PopResult Pop(shm::OpDescriptor* out);
  bool HasWork() const;

  // Writes the completion record for `op_id` (message truncated to fit) and
  // rings the client's doorbell.
  void Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns);

  // Tells the client the session is over (its waits fail fast).
  void Close();

  const SharedRegion& region() const { return *region_; }
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
