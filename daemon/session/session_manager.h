// The session manager: attached sessions, the jobs they form, buffer
// registration against the memory limits, and group creation. The gRPC
// services and the data-connection server call into it; the dispatcher reads
// it through SessionDirectory.
//
// Thread-safety: all methods are thread-safe. Lock order: mu_ before any
// Group's or Session's lock; Group::MemberLeft is called without mu_.
#ifndef HSDP_DAEMON_SESSION_SESSION_MANAGER_H_
#define HSDP_DAEMON_SESSION_SESSION_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config/node_config.h"
#include "daemon/dataplane/dispatcher.h"
#include "daemon/dataplane/group.h"
#include "daemon/engine/engine.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

struct AttachParams {
  std::string job_id;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string device = "cpu";
  int64_t pid = 0;
  uint32_t protocol_version = 0;
};

struct AttachResult {
  uint64_t session_id = 0;
  SessionToken token{};
  uint32_t ring_entries = 0;
};

struct NewGroupResult {
  uint32_t group_id = 0;
  int group_rank = 0;
  int group_size = 0;
};

struct JobSummary {
  std::string job_id;
  int world_size = 0;
  int attached = 0;
  uint32_t groups = 0;
};

class SessionManager : public SessionDirectory {
 public:
  // `max_node_bytes`: the resolved node-wide buffer limit.
  SessionManager(const NodeConfig& config, uint64_t max_node_bytes, Engine* engine);
  ~SessionManager() override;

  absl::StatusOr<AttachResult> Attach(const AttachParams& params, const PeerCred& caller);
  absl::Status Detach(uint64_t session_id, const PeerCred& caller);

  // The data connection's hello: checks the token and claims the session.
  absl::StatusOr<std::shared_ptr<Session>> ClaimSession(uint64_t session_id, const uint8_t* token,
                                                        const PeerCred& peer);

  // fd_tag 0: only check that `size_bytes` fits the limits.
  absl::StatusOr<uint64_t> RegisterBuffer(uint64_t session_id, uint64_t fd_tag,
                                          uint64_t size_bytes, const std::string& name,
                                          const PeerCred& caller);
  absl::Status FreeBuffer(uint64_t session_id, uint64_t buffer_id, const PeerCred& caller);
  absl::StatusOr<NewGroupResult> NewGroup(uint64_t session_id, const std::vector<int>& ranks,
                                          const PeerCred& caller);

  // nullptr when unknown.
  std::shared_ptr<Session> FindSession(uint64_t session_id) const;

  // Ends every session (daemon shutdown).
  void EndAll(const std::string& why);

  std::vector<JobSummary> Jobs() const;
  // Operations of sessions that already ended (live ones count their own).
  uint64_t retired_ops_completed() const { return retired_completed_.load(); }
  uint64_t retired_ops_failed() const { return retired_failed_.load(); }
  uint64_t bytes_registered() const;
  uint64_t max_node_bytes() const { return max_node_bytes_; }

  // SessionDirectory.
  uint64_t version() const override { return version_.load(std::memory_order_acquire); }
  std::vector<std::shared_ptr<Session>> Snapshot() const override;
  std::shared_ptr<Group> FindGroup(uint32_t group_id) const override;
  std::vector<std::shared_ptr<Group>> AllGroups() const override;
  void EndSession(uint64_t session_id, const std::string& why) override;
  void Housekeeping() override;

 private:
  struct Job {
    int world_size = 0;
    std::map<int, uint64_t> rank_to_session;
    // (ranks, k) -> group id: the k-th NewGroup call with `ranks`.
    std::map<std::pair<std::vector<int>, int>, uint32_t> groups;
    // (session id, ranks) -> calls so far.
    std::map<std::pair<uint64_t, std::vector<int>>, int> calls;
  };

  // The session, checking that `caller` may act on it.
  absl::StatusOr<std::shared_ptr<Session>> Lookup(uint64_t session_id, const PeerCred& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NodeConfig config_;
  const uint64_t max_node_bytes_;
  Engine* const engine_;

  std::atomic<uint64_t> version_{0};
  std::atomic<uint64_t> retired_completed_{0};
  std::atomic<uint64_t> retired_failed_{0};
  mutable absl::Mutex mu_;
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_group_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t node_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_SESSION_MANAGER_H_
