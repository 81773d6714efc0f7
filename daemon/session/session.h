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
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/job_key.h"
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
  uint32_t gid = 0;
  uint64_t features = 0; // negotiated at Attach (shm::Feature bits)
  uint32_t owner_uid = 0;  // the job's owner: `uid`, unless root joined another user's job

  JobKey job() const { return JobKey{owner_uid, job_id}; }
};

using SessionToken = std::array<uint8_t, shm::kSessionTokenBytes>;

// The operations in flight of all of one job's sessions on this node, and
// their limit (limits.max_job_ops_in_flight; 0 = none). The job's sessions
// share one (daemon/jobs hands it to each at Attach).
struct JobOpCount {
  explicit JobOpCount(int64_t max) : limit(max) {}
  std::atomic<int64_t> in_flight{0};
  const int64_t limit;
};

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
  using FdCallback = std::function<void(absl::StatusOr<UniqueFd>)>;
  // What an fd was passed as (shm::FdMessage::kind): a host memfd, claimed
  // only by RegisterBuffer, or a device-memory handle (kFeatureDeviceMemory),
  // claimed only by RegisterDeviceBuffer. A waiter for the other kind gets
  // INVALID_ARGUMENT and the fd is closed.
  enum class FdKind : uint8_t { kMemfd = 0, kDeviceHandle = 1 };
  // Hands the fd to a waiter for `tag`, or parks it (bounded) until one comes.
  void PutFd(uint64_t tag, UniqueFd fd, FdKind kind = FdKind::kMemfd);
  // Calls `done` with the fd tagged `tag` once it is here — at once if it
  // already is — or with NOT_FOUND once `deadline` passes (ExpireFdWaiters)
  // or the session ends. Never blocks. RESOURCE_EXHAUSTED (returned, `done`
  // not called) when the session already has kMaxFdWaiters waiters or a
  // waiter for `tag`. `done` runs on the thread that resolves it and must
  // not block.
  absl::Status AwaitFd(uint64_t tag, absl::Time deadline, FdCallback done,
                       FdKind kind = FdKind::kMemfd);
  // Fails waiters whose deadline passed.
  void ExpireFdWaiters(absl::Time now);
  static constexpr size_t kMaxFdWaiters = 16;

  // --- limits: reserved before the work, committed or released after ---
  // Reserves one more buffer of `bytes` against the session's limits.
  // RESOURCE_EXHAUSTED naming the limit when it does not fit.
  absl::Status ReserveBuffer(uint64_t bytes, uint64_t max_bytes, uint32_t max_buffers);
  void ReleaseReservation(uint64_t bytes);
  // Registered bytes plus registrations in progress (what the limits count).
  uint64_t used_bytes() const;
  // Operations submitted and not yet completed (bounded by the dispatcher).
  int64_t ops_in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  // Counts one more operation, for the session and its job; false when that
  // takes the job over its limit (the operation must then be refused; it is
  // counted all the same, and its completion uncounts it).
  bool BeginOp() {
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    if (job_ops_ == nullptr) return true;
    const int64_t n = job_ops_->in_flight.fetch_add(1, std::memory_order_relaxed) + 1;
    return job_ops_->limit <= 0 || n <= job_ops_->limit;
  }
  // The job's count; set once, before the session is published.
  void SetJobOpCount(std::shared_ptr<JobOpCount> c) { job_ops_ = std::move(c); }
  const JobOpCount* job_op_count() const { return job_ops_.get(); }

  // --- buffers ---
  // Returns the new buffer's id (> 0), or 0 when the session already ended.
  uint64_t AddBuffer(std::shared_ptr<MappedBuffer> buffer);
  // Returns the removed buffer, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<MappedBuffer>> RemoveBuffer(uint64_t id);
  // nullptr when unknown.
  std::shared_ptr<MappedBuffer> FindBuffer(uint64_t id) const;
  uint32_t buffer_count() const;
  uint64_t buffer_bytes() const;
  // Drops every buffer and fd waiter (end of session); returns the bytes
  // released (registered buffers only; reservations are released by their
  // owners).
  uint64_t ClearBuffers();

  // --- operations ---
  // Writes op `op_id`'s completion to the client and counts it.
  void Complete(uint64_t op_id, const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns,
                int32_t peer = -1, uint64_t event_id = 0);
  uint64_t ops_completed() const { return ops_completed_.load(); }
  uint64_t ops_failed() const { return ops_failed_.load(); }

  // --- lifecycle ---
  // The session manager is ending it (set before its groups go): an
  // operation still queued in its ring fails as not started (UNAVAILABLE),
  // not as naming a group that no longer exists.
  void MarkEnding() { ending_.store(true); }
  bool ending() const { return ending_.load(); }
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
  std::atomic<bool> ending_{false};
  std::atomic<uint64_t> ops_completed_{0};
  std::atomic<uint64_t> ops_failed_{0};
  std::atomic<int64_t> in_flight_{0};
  std::shared_ptr<JobOpCount> job_ops_;  // null: no job count (tests)  // may dip below 0 for ops completed without BeginOp (tests)

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<MappedBuffer>> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_buffer_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t buffer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // registrations in progress
  uint32_t reserved_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::pair<UniqueFd, FdKind>> pending_fds_ ABSL_GUARDED_BY(mu_);
  struct FdWaiter {
    absl::Time deadline;
    FdCallback done;
    FdKind kind = FdKind::kMemfd;
  };
  std::map<uint64_t, FdWaiter> fd_waiters_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_SESSION_H_
