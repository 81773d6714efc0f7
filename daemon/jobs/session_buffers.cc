// SessionManager: buffers registered and freed against the limits (bytes and
// count per session, bytes and mappings per node), reserved first and released
// when the registration fails; the memfd is awaited without blocking and mapped
// on the control executor. Also the mapping budget below vm.max_map_count and
// the node-wide counts. The rest of SessionManager: session_manager.h lists its
// files.
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/util/executor.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

constexpr absl::Duration kFdArrivalTimeout = absl::Seconds(5);

std::string FormatBytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrCat(b, " bytes (", b >> 30, " GiB)");
  if (b >= (1ull << 20)) return absl::StrCat(b, " bytes (", b >> 20, " MiB)");
  return absl::StrCat(b, " bytes");
}

// a + b without wrapping (for messages and comparisons).
uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

uint64_t MappingBudget(uint64_t kernel_limit) {
  return kernel_limit / 4 * 3 > 1024 ? kernel_limit / 4 * 3 : 1024;
}

uint64_t KernelMaxMapCount() {
  FILE* f = std::fopen("/proc/sys/vm/max_map_count", "re");
  unsigned long long v = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%llu", &v) != 1) v = 0;
    std::fclose(f);
  }
  return v > 0 ? v : 65530;
}

void SessionManager::RegisterBuffer(uint64_t session_id, uint64_t fd_tag, uint64_t size_bytes,
                                    const std::string& name, const PeerCred& caller,
                                    RegisterDone done) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<std::shared_ptr<Session>> found = Lookup(session_id, caller);
    if (!found.ok()) return done(found.status());
    s = *std::move(found);
    if (size_bytes == 0) return done(absl::InvalidArgumentError("size_bytes: must be > 0"));
    if (size_bytes > limits_.max_node_bytes || node_bytes_ > limits_.max_node_bytes - size_bytes) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "a buffer of ", FormatBytes(size_bytes), " would bring this node to ",
          FormatBytes(SaturatingAdd(node_bytes_, size_bytes)), ", over the node limit of ",
          FormatBytes(limits_.max_node_bytes), " (limits.max_node_bytes)")));
    }
    if (node_mappings_ >= limits_.max_mappings) {
      return done(
          absl::ResourceExhaustedError(absl::StrCat("this node already has ", node_mappings_,
                                                    " shared-memory mappings (the budget below "
                                                    "vm.max_map_count is ",
                                                    limits_.max_mappings, ")")));
    }
    if (absl::Status r = CheckJobBytesLocked(*s, size_bytes); !r.ok()) return done(r);
    if (absl::Status r = s->ReserveBuffer(size_bytes, config_.max_session_bytes,
                                          config_.max_buffers_per_session);
        !r.ok()) {
      return done(r);
    }
    if (absl::Status r = bytes_share_.Take(s->info().uid, size_bytes); !r.ok()) {
      s->ReleaseReservation(size_bytes);
      return done(r);
    }
    if (fd_tag == 0) {
      bytes_share_.Give(s->info().uid, size_bytes);
      s->ReleaseReservation(size_bytes);
      return done(uint64_t{0});
    }
    node_bytes_ += size_bytes;  // reserved now; committed or released below
    ++node_mappings_;
  }
  auto finish = [this, s, size_bytes, name, done](absl::StatusOr<UniqueFd> fd) {
    auto work = [this, s, size_bytes, name, done,
                 fd = std::make_shared<absl::StatusOr<UniqueFd>>(std::move(fd))]() mutable {
      done(FinishRegister(s, std::move(*fd), size_bytes, name));
    };
    if (control_ != nullptr) {
      control_->Post(std::move(work));
    } else {
      work();
    }
  };
  if (absl::Status w = s->AwaitFd(fd_tag, absl::Now() + kFdArrivalTimeout, finish); !w.ok()) {
    s->ReleaseReservation(size_bytes);
    ReleaseNode(s->info().uid, size_bytes, 1);
    done(w);
  }
}

absl::StatusOr<uint64_t> SessionManager::FinishRegister(const std::shared_ptr<Session>& s,
                                                        absl::StatusOr<UniqueFd> fd,
                                                        uint64_t size_bytes,
                                                        const std::string& name) {
  absl::StatusOr<std::shared_ptr<MappedBuffer>> buf =
      fd.ok() ? MappedBuffer::Map(std::move(*fd), size_bytes, name)
              : absl::StatusOr<std::shared_ptr<MappedBuffer>>(fd.status());
  if (buf.ok() && s->closed()) {
    buf = absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  if (!buf.ok()) {
    s->ReleaseReservation(size_bytes);
    ReleaseNode(s->info().uid, size_bytes, 1);
    return buf.status();
  }
  // Added before the reservation goes, so that the job's and the session's
  // bytes never dip below what is held (another registration checking them
  // meanwhile sees at least the truth).
  const uint64_t id = s->AddBuffer(std::move(*buf));
  s->ReleaseReservation(size_bytes);
  if (id == 0) {  // ended while mapping: its ClearBuffers did not count this one
    ReleaseNode(s->info().uid, size_bytes, 1);
    return absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  HSDP_LOG(Debug) << "session " << s->id() << " registered buffer " << id << " (" << size_bytes
                  << " bytes)";
  return id;
}

absl::Status SessionManager::CheckJobBytesLocked(const Session& s, uint64_t size_bytes) const {
  if (config_.max_job_bytes == 0) return absl::OkStatus();
  const JobKey key = s.info().job();
  uint64_t used = 0;
  if (const Job* job = jobs_.Find(key); job != nullptr) {
    for (const auto& [rank, session_id] : job->rank_to_session) {
      if (auto it = sessions_.find(session_id); it != sessions_.end()) {
        used += it->second->used_bytes();
      }
    }
  }
  if (size_bytes > config_.max_job_bytes || used > config_.max_job_bytes - size_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a buffer of ", FormatBytes(size_bytes), " would bring ", key.Describe(), " to ",
        FormatBytes(SaturatingAdd(used, size_bytes)), " on this node, over its limit of ",
        FormatBytes(config_.max_job_bytes), " (limits.max_job_bytes)"));
  }
  return absl::OkStatus();
}

void SessionManager::ReleaseNode(uint32_t uid, uint64_t bytes, uint64_t mappings) {
  absl::MutexLock l(&mu_);
  node_bytes_ -= bytes;
  bytes_share_.Give(uid, bytes);
  node_mappings_ -= mappings;
}

absl::StatusOr<uint64_t> SessionManager::RegisterBufferSync(uint64_t session_id, uint64_t fd_tag,
                                                            uint64_t size_bytes,
                                                            const std::string& name,
                                                            const PeerCred& caller) {
  absl::Mutex mu;
  std::optional<absl::StatusOr<uint64_t>> result;
  RegisterBuffer(session_id, fd_tag, size_bytes, name, caller, [&](absl::StatusOr<uint64_t> r) {
    absl::MutexLock l(&mu);
    result = std::move(r);
  });
  absl::MutexLock l(&mu);
  mu.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<uint64_t>>* r) { return r->has_value(); }, &result));
  return *std::move(result);
}

absl::Status SessionManager::FreeBuffer(uint64_t session_id, uint64_t buffer_id,
                                        const PeerCred& caller) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Lookup(session_id, caller));
  ASSIGN_OR_RETURN(std::shared_ptr<MappedBuffer> b, s->RemoveBuffer(buffer_id));
  node_bytes_ -= b->size();
  bytes_share_.Give(s->info().uid, b->size());
  --node_mappings_;
  return absl::OkStatus();  // unmapped when the last in-flight op lets go
}

uint64_t SessionManager::mappings() const {
  absl::MutexLock l(&mu_);
  return node_mappings_;
}

uint64_t SessionManager::bytes_registered() const {
  absl::MutexLock l(&mu_);
  return node_bytes_;
}

}  // namespace hsdp
