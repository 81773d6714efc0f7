#include "daemon/session/session_manager.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_join.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

constexpr int kMaxWorldSize = 1 << 20;
constexpr absl::Duration kFdArrivalTimeout = absl::Seconds(5);

std::string FormatBytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrCat(b, " bytes (", b >> 30, " GiB)");
  if (b >= (1ull << 20)) return absl::StrCat(b, " bytes (", b >> 20, " MiB)");
  return absl::StrCat(b, " bytes");
}

absl::Status ValidateAttach(const AttachParams& p) {
  if (p.job_id.empty() || p.job_id.size() > 128) {
    return absl::InvalidArgumentError("job_id: must be 1 to 128 bytes");
  }
  for (unsigned char ch : p.job_id) {
    if (ch < 0x20 || ch > 0x7e) {
      return absl::InvalidArgumentError("job_id: only printable ASCII is allowed");
    }
  }
  if (p.world_size < 1 || p.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", p.world_size, " is outside [1, ", kMaxWorldSize, "]"));
  }
  if (p.rank < 0 || p.rank >= p.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", p.rank, " is outside [0, world_size=", p.world_size, ")"));
  }
  if (p.local_rank < 0 || p.local_rank >= 65536) {
    return absl::InvalidArgumentError(absl::StrCat("local_rank: ", p.local_rank, " is invalid"));
  }
  const bool cpu = p.device == "cpu";
  const bool cuda = p.device.rfind("cuda:", 0) == 0 && p.device.size() > 5 &&
                    std::all_of(p.device.begin() + 5, p.device.end(), ::isdigit);
  if (!cpu && !cuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: \"", p.device, "\" is neither \"cpu\" nor \"cuda:N\""));
  }
  if (p.protocol_version != shm::kLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "protocol_version: the client speaks shared-memory layout ", p.protocol_version,
        ", this hsdpd speaks ", shm::kLayoutVersion, "; use matching versions"));
  }
  return absl::OkStatus();
}

SessionToken NewToken() {
  std::random_device rd;  // /dev/urandom
  SessionToken t;
  for (size_t i = 0; i < t.size(); i += 4) {
    const uint32_t v = rd();
    for (size_t j = 0; j < 4 && i + j < t.size(); ++j) t[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return t;
}

}  // namespace

SessionManager::SessionManager(const NodeConfig& config, uint64_t max_node_bytes, Engine* engine)
    : config_(config), max_node_bytes_(max_node_bytes), engine_(engine) {}

SessionManager::~SessionManager() = default;

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Lookup(uint64_t session_id,
                                                                const PeerCred& caller) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", session_id,
                                            " (never attached, detached, or its process exited)"));
  }
  if (caller.uid != 0 && caller.uid != it->second->info().uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", session_id, " belongs to uid ", it->second->info().uid));
  }
  return it->second;
}

absl::StatusOr<AttachResult> SessionManager::Attach(const AttachParams& p, const PeerCred& caller) {
  RETURN_IF_ERROR(ValidateAttach(p));
  absl::MutexLock l(&mu_);
  if (sessions_.size() >= config_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this hsdpd already has ", sessions_.size(), " sessions (limits.max_sessions)"));
  }
  auto job_it = jobs_.find(p.job_id);
  if (job_it != jobs_.end()) {
    Job& job = job_it->second;
    if (job.world_size != p.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("world_size: job \"", p.job_id,
                                                     "\" has world size ", job.world_size,
                                                     ", this trainer says ", p.world_size));
    }
    if (auto r = job.rank_to_session.find(p.rank); r != job.rank_to_session.end()) {
      const auto& other = sessions_.at(r->second);
      return absl::AlreadyExistsError(absl::StrCat(
          "rank: rank ", p.rank, " of job \"", p.job_id, "\" is already attached (session ",
          other->id(), ", pid ", other->info().pid, ")"));
    }
  }
  const uint64_t id = next_session_id_++;
  ASSIGN_OR_RETURN(std::unique_ptr<ShmChannel> channel,
                   ShmChannel::Create(id, config_.ring_entries));
  SessionInfo info{p.job_id, p.rank, p.world_size, p.local_rank, p.device, p.pid, caller.uid};
  const SessionToken token = NewToken();
  auto session = std::make_shared<Session>(id, info, token, std::move(channel));
  Job& job = jobs_[p.job_id];
  job.world_size = p.world_size;
  job.rank_to_session[p.rank] = id;
  sessions_[id] = session;
  version_.fetch_add(1, std::memory_order_release);
  HSDP_LOG(Info) << "session " << id << " attached: job \"" << p.job_id << "\" rank " << p.rank
                 << "/" << p.world_size << " pid " << p.pid << " uid " << caller.uid << " device "
                 << p.device;
  AttachResult result;
  result.session_id = id;
  result.ring_entries = config_.ring_entries;
  result.token = token;
  return result;
}

absl::Status SessionManager::Detach(uint64_t session_id, const PeerCred& caller) {
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(Lookup(session_id, caller).status());
  }
  EndSession(session_id, "detached");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::ClaimSession(uint64_t session_id,
                                                                      const uint8_t* token,
                                                                      const PeerCred& peer) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Lookup(session_id, peer));
  if (!s->TokenMatches(token)) {
    return absl::PermissionDeniedError("session token does not match");
  }
  if (!s->MarkDataConnected(peer.pid)) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", session_id, " already has a data connection"));
  }
  version_.fetch_add(1, std::memory_order_release);
  return s;
}

absl::StatusOr<uint64_t> SessionManager::RegisterBuffer(uint64_t session_id, uint64_t fd_tag,
                                                        uint64_t size_bytes,
                                                        const std::string& name,
                                                        const PeerCred& caller) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(s, Lookup(session_id, caller));
    if (size_bytes == 0) return absl::InvalidArgumentError("size_bytes: must be > 0");
    const uint64_t session_bytes = s->buffer_bytes();
    if (size_bytes > config_.max_session_bytes ||
        session_bytes > config_.max_session_bytes - size_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a buffer of ", FormatBytes(size_bytes), " would bring session ", session_id, " to ",
          FormatBytes(session_bytes + size_bytes), ", over limits.max_session_bytes = ",
          FormatBytes(config_.max_session_bytes)));
    }
    if (size_bytes > max_node_bytes_ || node_bytes_ > max_node_bytes_ - size_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a buffer of ", FormatBytes(size_bytes), " would bring this node to ",
          FormatBytes(node_bytes_ + size_bytes), ", over the node limit of ",
          FormatBytes(max_node_bytes_), " (limits.max_node_bytes)"));
    }
    if (s->buffer_count() >= config_.max_buffers_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", session_id, " already has ", s->buffer_count(),
          " buffers (limits.max_buffers_per_session)"));
    }
    if (fd_tag == 0) return uint64_t{0};
    node_bytes_ += size_bytes;  // reserved now, released below on failure
  }
  auto release = [&] {
    absl::MutexLock l(&mu_);
    node_bytes_ -= size_bytes;
  };
  absl::StatusOr<UniqueFd> fd = s->TakeFd(fd_tag, kFdArrivalTimeout);
  if (!fd.ok()) {
    release();
    return fd.status();
  }
  absl::StatusOr<std::shared_ptr<MappedBuffer>> buf =
      MappedBuffer::Map(std::move(*fd), size_bytes, name);
  if (!buf.ok()) {
    release();
    return buf.status();
  }
  if (s->closed()) {
    release();
    return absl::NotFoundError(absl::StrCat("session_id: session ", session_id, " ended"));
  }
  const uint64_t id = s->AddBuffer(std::move(*buf));
  HSDP_LOG(Debug) << "session " << session_id << " registered buffer " << id << " ("
                  << size_bytes << " bytes)";
  return id;
}

absl::Status SessionManager::FreeBuffer(uint64_t session_id, uint64_t buffer_id,
                                        const PeerCred& caller) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Lookup(session_id, caller));
  ASSIGN_OR_RETURN(std::shared_ptr<MappedBuffer> b, s->RemoveBuffer(buffer_id));
  node_bytes_ -= b->size();
  return absl::OkStatus();  // unmapped when the last in-flight op lets go
}

absl::StatusOr<NewGroupResult> SessionManager::NewGroup(uint64_t session_id,
                                                        const std::vector<int>& ranks,
                                                        const PeerCred& caller) {
  std::shared_ptr<Group> group;
  std::shared_ptr<Session> s;
  int group_rank = -1;
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(s, Lookup(session_id, caller));
    Job& job = jobs_.at(s->info().job_id);
    if (ranks.empty()) return absl::InvalidArgumentError("ranks: must not be empty");
    std::set<int> seen;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= job.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("ranks[", i, "]: ", ranks[i],
                                                       " is outside [0, world_size=",
                                                       job.world_size, ")"));
      }
      if (!seen.insert(ranks[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("ranks[", i, "]: rank ", ranks[i], " appears twice"));
      }
      if (ranks[i] == s->info().rank) group_rank = static_cast<int>(i);
    }
    if (group_rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: the caller's rank ", s->info().rank, " is not in [", absl::StrJoin(ranks, ", "),
          "]; only members call NewGroup"));
    }
    const int k = job.calls[{session_id, ranks}]++;
    auto key = std::make_pair(ranks, k);
    auto it = job.groups.find(key);
    if (it != job.groups.end()) {
      group = groups_.at(it->second);
    } else {
      if (job.groups.size() >= config_.max_groups_per_job) {
        job.calls[{session_id, ranks}]--;
        return absl::ResourceExhaustedError(absl::StrCat(
            "job \"", s->info().job_id, "\" already has ", job.groups.size(),
            " groups (limits.max_groups_per_job)"));
      }
      const uint32_t id = next_group_id_++;
      group = std::make_shared<Group>(
          id, s->info().job_id, ranks, engine_,
          [this](uint32_t gid) { return FindGroup(gid); },
          int64_t{config_.collective_timeout_ms} * 1'000'000);
      groups_[id] = group;
      job.groups[key] = id;
    }
  }
  RETURN_IF_ERROR(group->Join(group_rank, s));
  return NewGroupResult{group->id(), group_rank, group->size()};
}

void SessionManager::EndSession(uint64_t session_id, const std::string& why) {
  std::shared_ptr<Session> s;
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    s = it->second;
    sessions_.erase(it);
    auto job_it = jobs_.find(s->info().job_id);
    if (job_it != jobs_.end()) {
      Job& job = job_it->second;
      job.rank_to_session.erase(s->info().rank);
      for (auto& [key, gid] : job.groups) groups.push_back(groups_.at(gid));
      if (job.rank_to_session.empty()) {
        for (auto& [key, gid] : job.groups) groups_.erase(gid);
        jobs_.erase(job_it);
      }
    }
    node_bytes_ -= s->ClearBuffers();
    version_.fetch_add(1, std::memory_order_release);
  }
  s->Close();
  for (const std::shared_ptr<Group>& g : groups) g->MemberLeft(s.get(), why);
  retired_completed_.fetch_add(s->ops_completed());
  retired_failed_.fetch_add(s->ops_failed());
  HSDP_LOG(Info) << "session " << session_id << " (job \"" << s->info().job_id << "\" rank "
                 << s->info().rank << ") ended: " << why;
}

void SessionManager::EndAll(const std::string& why) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, s] : sessions_) ids.push_back(id);
  }
  for (uint64_t id : ids) EndSession(id, why);
}

void SessionManager::Housekeeping() {
  std::vector<uint64_t> expired;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, s] : sessions_) {
      if (!s->data_connected() && s->AgeSeconds() * 1000 > config_.data_connect_timeout_ms) {
        expired.push_back(id);
      }
    }
  }
  for (uint64_t id : expired) {
    EndSession(id, "no data connection arrived within timeouts.data_connect_ms");
  }
}

std::vector<std::shared_ptr<Session>> SessionManager::Snapshot() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

std::shared_ptr<Session> SessionManager::FindSession(uint64_t session_id) const {
  absl::MutexLock l(&mu_);
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second;
}

std::shared_ptr<Group> SessionManager::FindGroup(uint32_t group_id) const {
  absl::MutexLock l(&mu_);
  auto it = groups_.find(group_id);
  return it == groups_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Group>> SessionManager::AllGroups() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Group>> out;
  for (auto& [id, g] : groups_) out.push_back(g);
  return out;
}

std::vector<JobSummary> SessionManager::Jobs() const {
  absl::MutexLock l(&mu_);
  std::vector<JobSummary> out;
  for (auto& [name, job] : jobs_) {
    out.push_back(JobSummary{name, job.world_size, static_cast<int>(job.rank_to_session.size()),
                             static_cast<uint32_t>(job.groups.size())});
  }
  return out;
}

uint64_t SessionManager::bytes_registered() const {
  absl::MutexLock l(&mu_);
  return node_bytes_;
}

}  // namespace hsdp
