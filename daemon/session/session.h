// One attached trainer: its identity, its shared-memory channel, its
// registered buffers and the fds it passed but has not registered yet.
//
// Thread-safety: all methods are thread-safe. Buffers and pending fds are
// guarded by mu_; counters are atomics; the channel has its own rules.
#ifndef HSDP_DAEMON_SESSION_SESSION_H_
#define HSDP_DAEMON_SESSION_SESSION_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/mapped_buffer.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/shm/data_conn.h"

namespace hsdp {

struct SessionInfo {
  std::string job_id;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string device;
  int64_t pid = 0;       // as the client reported it
  uint32_t uid = 0;      // from SO_PEERCRED of the Attach call
};

using SessionToken = std::array<uint8_t, shm::kSessionTokenBytes>;

class Session {
 public:
  Session(uint64_t id, SessionInfo info, SessionToken token, std::unique_ptr<ShmChannel> channel);

  uint64_t id() const { return id_; }
  const SessionInfo& info() const { return info_; }
  bool TokenMatches(const uint8_t* token) const;
  ShmChannel& channel() { return *channel_; }
  double AgeSeconds() const;

  // --- data connection ---
  // Claims the session for a data connection; false if already claimed.
  bool MarkDataConnected(int64_t peer_pid);
  bool data_connected() const { return data_connected_.load(); }
  int64_t peer_pid() const { return peer_pid_.load(); }

  // --- fds passed over the data connection, claimed by RegisterBuffer ---
  void PutFd(uint64_t tag, UniqueFd fd);
  // Waits up to `timeout` for the fd tagged `tag`. NOT_FOUND when it never came.
  absl::StatusOr<UniqueFd> TakeFd(uint64_t tag, absl::Duration timeout);

  // --- buffers ---
  uint64_t AddBuffer(std::shared_ptr<MappedBuffer> buffer);
  // Returns the removed buffer, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<MappedBuffer>> RemoveBuffer(uint64_t id);
  // nullptr when unknown.
  std::shared_ptr<MappedBuffer> FindBuffer(uint64_t id) const;
  uint32_t buffer_count() const;
  uint64_t buffer_bytes() const;
  // Drops every buffer (end of session); returns the bytes released.
  uint64_t ClearBuffers();

  // --- operations ---
  // Writes op `op_id`'s completion to the client and counts it.
  void Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns);
  uint64_t ops_completed() const { return ops_completed_.load(); }
  uint64_t ops_failed() const { return ops_failed_.load(); }

  // --- lifecycle ---
  // Marks the session over and tells the client through the channel.
  void Close();
  bool closed() const { return closed_.load(); }

 private:
  const uint64_t id_;
  const SessionInfo info_;
  const SessionToken token_;
  const std::unique_ptr<ShmChannel> channel_;
  const absl::Time created_;

  std::atomic<bool> data_connected_{false};
  std::atomic<int64_t> peer_pid_{0};
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> ops_completed_{0};
  std::atomic<uint64_t> ops_failed_{0};

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<MappedBuffer>> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_buffer_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t buffer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, UniqueFd> pending_fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_SESSION_H_
