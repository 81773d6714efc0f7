// SessionManager: buffers registered and freed against the limits (bytes and
// count per session, per job, and the node's in its NodeLedger), reserved first
// and released when the registration fails; the memfd is awaited without
// blocking and mapped on the control executor. Also the node-wide counts. The
// rest of SessionManager: session_manager.h lists its files.
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

}  // namespace

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
    if (absl::Status r = ledger_.CheckBufferFits(size_bytes); !r.ok()) return done(r);
    if (absl::Status r = ledger_.CheckJobBytes(s->info().job(), JobBytesLocked(*s), size_bytes);
        !r.ok()) {
      return done(r);
    }
    if (absl::Status r = s->ReserveBuffer(size_bytes, config_.max_session_bytes,
                                          config_.max_buffers_per_session);
        !r.ok()) {
      return done(r);
    }
    // Reserved now; committed or released below.
    if (absl::Status r = ledger_.ReserveBuffer(s->info().uid, size_bytes); !r.ok()) {
      s->ReleaseReservation(size_bytes);
      return done(r);
    }
    if (fd_tag == 0) {
      ledger_.ReleaseBuffers(s->info().uid, 1, size_bytes);
      s->ReleaseReservation(size_bytes);
      return done(uint64_t{0});
    }
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
    ReleaseRegistration(s->info().uid, size_bytes);
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
    ReleaseRegistration(s->info().uid, size_bytes);
    return buf.status();
  }
  // Added before the reservation goes, so that the job's and the session's
  // bytes never dip below what is held (another registration checking them
  // meanwhile sees at least the truth).
  const uint64_t id = s->AddBuffer(std::move(*buf));
  s->ReleaseReservation(size_bytes);
  if (id == 0) {  // ended while mapping: its ClearBuffers did not count this one
    ReleaseRegistration(s->info().uid, size_bytes);
    return absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  HSDP_LOG(Debug) << "session " << s->id() << " registered buffer " << id << " (" << size_bytes
                  << " bytes)";
  return id;
}

uint64_t SessionManager::JobBytesLocked(const Session& s) const {
  if (config_.max_job_bytes == 0) return 0;  // not limited: not summed
  uint64_t used = 0;
  if (const Job* job = jobs_.Find(s.info().job()); job != nullptr) {
    for (const auto& [rank, session_id] : job->rank_to_session) {
      if (auto it = sessions_.find(session_id); it != sessions_.end()) {
        used += it->second->used_bytes();
      }
    }
  }
  return used;
}

void SessionManager::ReleaseRegistration(uint32_t uid, uint64_t size_bytes) {
  absl::MutexLock l(&mu_);
  ledger_.ReleaseBuffers(uid, 1, size_bytes);
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
  ledger_.ReleaseBuffers(s->info().uid, 1, b->size());
  return absl::OkStatus();  // unmapped when the last in-flight op lets go
}

uint64_t SessionManager::mappings() const {
  absl::MutexLock l(&mu_);
  return ledger_.mappings();
}

uint64_t SessionManager::bytes_registered() const {
  absl::MutexLock l(&mu_);
  return ledger_.bytes();
}

}  // namespace hsdp
