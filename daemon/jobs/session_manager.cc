// SessionManager: sessions attaching (the job chosen and checked, the rank
// placed in the cluster first when there is one), claimed by their data
// connection, detaching and ending (their groups' epochs fail; a job's last
// session takes its groups and their engine state with it, a cross-node group's
// a little later), the session-end hooks, the lookups, and housekeeping (that
// engine state destroyed, sessions whose data connection never came ended). The
// rest of SessionManager: session_manager.h lists its files.
#include "daemon/jobs/session_manager.h"

#include <algorithm>
#include <cctype>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/version.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

constexpr int kMaxWorldSize = 1 << 20;
// An ended group's arena is released once its members finished what was
// committed there (microseconds), at the latest this long after.
constexpr absl::Duration kArenaReleaseGrace = absl::Seconds(5);

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
        ", this hsdpd (", kHsdpVersion, ") speaks layout ", shm::kLayoutVersion,
        "; use a client library and daemon of matching versions"));
  }
  if ((p.features & shm::kFeaturesRequired) != shm::kFeaturesRequired) {
    return absl::FailedPreconditionError(
        absl::StrCat("features: the client offers 0x", absl::Hex(p.features), ", this hsdpd (",
                     kHsdpVersion, ") requires 0x", absl::Hex(shm::kFeaturesRequired),
                     "; use a client library and daemon of matching versions"));
  }
  if (!p.priority_class.empty() && !ValidPriorityClassName(p.priority_class)) {
    return absl::InvalidArgumentError(
        "priority_class: a class name is 1 to 32 bytes of a-z, 0-9, '_' and '-'");
  }
  return absl::OkStatus();
}

// Session ids start at a random place in [1, 2^52] (JSON-exact), so that an
// id a client kept from an earlier incarnation of the daemon (a call made
// around a restart, a Detach after a failed reconnect) names no session of
// this one: sequential ids from 1 handed the same numbers to other trainers,
// and the uid check alone let a stale Detach end a trainer of the same uid
// (any trainer, when the caller runs as root).
uint64_t FirstSessionId() {
  std::random_device rd;  // /dev/urandom
  const uint64_t r = (uint64_t{rd()} << 32) | rd();
  return 1 + (r & ((uint64_t{1} << 51) - 1));
}

SessionToken NewToken() {
  std::random_device rd;  // /dev/urandom
  SessionToken t;
  for (size_t i = 0; i < t.size(); i += 4) {
    const uint32_t v = rd();
    for (size_t j = 0; j < 4 && i + j < t.size(); ++j)
      t[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return t;
}

}  // namespace

SessionManager::SessionManager(const NodeConfig& config, NodeLimits limits, Engine* engine,
                               Executor* control, OpObserver* observer, ClusterDirectory* cluster,
                               const Clock* clock)
    : config_(config),
      limits_(limits),
      arena_budget_(NewArenaBudget(uint64_t{config.small_op_arena_mib} << 20,
                                   config.uid_share_percent)),
      arena_reaper_(std::make_shared<ArenaReaper>(kArenaReleaseGrace)),
      engine_(engine),
      control_(control),
      observer_(observer),
      cluster_(cluster),
      placement_waits_(config.uid_share_percent),
      ledger_(limits, config.max_sessions, config.max_job_bytes, config.uid_share_percent),
      retired_((2 * int64_t{config.cluster_heartbeat_ms} + 500) * 1'000'000, clock) {
  next_session_id_ = FirstSessionId();
}

absl::Time SessionManager::ClusterDeadline() const {
  return absl::Now() + absl::Milliseconds(config_.cluster_join_timeout_ms);
}

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

absl::StatusOr<JobChoice> SessionManager::ChooseJobLocked(const AttachParams& p,
                                                          const PeerCred& caller) const {
  ASSIGN_OR_RETURN(
      JobChoice choice,
      jobs_.Choose(p.job_id, AttachIdentity{caller.uid, p.caller_is_admin, p.owner_uid},
                   cluster_ != nullptr));
  RETURN_IF_ERROR(CheckJoinLocked(choice.key, p));
  return choice;
}

absl::Status SessionManager::CheckJoinLocked(const JobKey& key, const AttachParams& p) const {
  return jobs_.CheckJoin(key, p.rank, p.world_size, [this](uint64_t session_id) {
    auto it = sessions_.find(session_id);
    return it == sessions_.end()
               ? absl::StrCat("session ", session_id)
               : absl::StrCat("session ", session_id, ", pid ", it->second->info().pid);
  });
}

absl::StatusOr<ResolvedClass> SessionManager::ChooseClassLocked(const JobKey& key,
                                                                 const std::string& requested) const {
  if (const Job* job = jobs_.Find(key); job != nullptr) {
    if (!requested.empty() && requested != job->priority_class) {
      return absl::FailedPreconditionError(absl::StrCat(
          "priority_class: ", key.Describe(), " is in class \"", job->priority_class,
          "\" (its first member's); a member cannot ask for \"", absl::CHexEscape(requested),
          "\""));
    }
    return ResolvedClass{job->priority_class, job->priority_level};
  }
  return ChooseJobClass(config_.priority_classes, key.name, key.owner_uid, requested);
}

absl::StatusOr<AttachResult> SessionManager::Attach(const AttachParams& p, const PeerCred& caller) {
  if (draining()) {
    return absl::UnavailableError(
        "hsdpd is draining for a restart (hsdpctl drain): attach again once it is back");
  }
  RETURN_IF_ERROR(ValidateAttach(p));
  JobChoice choice;
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(choice, ChooseJobLocked(p, caller));
  }
  if (cluster_ == nullptr) return AttachHere(p, choice, caller);
  // Placed in the cluster first (no lock held: this is a network call).
  RETURN_IF_ERROR(
      cluster_->Publish(choice.key, p.rank, p.world_size, ClusterDeadline(), choice.join_only));
  absl::StatusOr<AttachResult> r = AttachHere(p, choice, caller);
  if (!r.ok()) {
    bool here;
    {
      absl::MutexLock l(&mu_);
      const Job* job = jobs_.Find(choice.key);
      here = job != nullptr && job->rank_to_session.count(p.rank) > 0;
    }
    if (!here) cluster_->Withdraw(choice.key, {p.rank}, ClusterDeadline());
  }
  return r;
}

absl::StatusOr<AttachResult> SessionManager::AttachHere(const AttachParams& p,
                                                        const JobChoice& choice,
                                                        const PeerCred& caller) {
  absl::MutexLock l(&mu_);
  if (sessions_.size() >= config_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat("this hsdpd already has ", sessions_.size(),
                                                     " sessions (limits.max_sessions)"));
  }
  if (choice.join_only && cluster_ == nullptr && jobs_.Find(choice.key) == nullptr) {
    // Its last rank left since ChooseJobLocked: root never creates it.
    return absl::NotFoundError(
        absl::StrCat("owner_uid: ", choice.key.Describe(), " is no longer attached on this node"));
  }
  RETURN_IF_ERROR(CheckJoinLocked(choice.key, p));
  ASSIGN_OR_RETURN(const ResolvedClass qos, ChooseClassLocked(choice.key, p.priority_class));
  RETURN_IF_ERROR(ledger_.ReserveSession(caller.uid));  // the session and its channel's mapping
  const uint64_t id = next_session_id_++;
  const uint64_t features = p.features & (shm::kFeaturesImplemented | extra_features_.load());
  absl::StatusOr<std::unique_ptr<ShmChannel>> channel =
      ShmChannel::Create(id, config_.ring_entries, features);
  if (!channel.ok()) {
    ledger_.ReleaseSession(caller.uid);
    return channel.status();
  }
  SessionInfo info{p.job_id, p.rank,     p.world_size, p.local_rank, p.device,
                   p.pid,    caller.uid, caller.gid,   features,     choice.key.owner_uid};
  const SessionToken token = NewToken();
  auto session = std::make_shared<Session>(id, info, token, *std::move(channel));
  Job& job = jobs_.FindOrAdd(choice.key);
  job.world_size = p.world_size;
  job.priority_class = qos.name;
  job.priority_level = qos.level;
  if (job.ops == nullptr) {
    job.ops = std::make_shared<JobOpCount>(static_cast<int64_t>(config_.max_job_ops_in_flight));
  }
  session->SetJobOpCount(job.ops);
  job.rank_to_session[p.rank] = id;
  sessions_[id] = session;
  version_.fetch_add(1, std::memory_order_release);
  HSDP_LOG(Info) << "session " << id << " attached: " << choice.key.Describe() << " rank " << p.rank
                 << "/" << p.world_size << " pid " << p.pid << " uid " << caller.uid << " device "
                 << p.device;
  AttachResult result;
  result.session_id = id;
  result.ring_entries = config_.ring_entries;
  result.token = token;
  result.features = features;
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

void SessionManager::EndSession(uint64_t session_id, const std::string& why) {
  std::shared_ptr<Session> s;
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    s = it->second;
    s->MarkEnding();  // before its groups go (the dispatcher reads it after a failed lookup)
    sessions_.erase(it);
    if (Job* job_ptr = jobs_.Find(s->info().job()); job_ptr != nullptr) {
      Job& job = *job_ptr;
      job.rank_to_session.erase(s->info().rank);
      for (auto& [key, gid] : job.groups) groups.push_back(groups_.at(gid));
      if (job.rank_to_session.empty()) {
        for (auto& [key, gid] : job.groups) {
          // A group that spans nodes keeps its engine state (its links) a
          // little longer, so the other daemons learn why from this node's
          // report rather than from a connection reset.
          const std::shared_ptr<Group>& g = groups_.at(gid);
          for (const std::string& engine_key : g->engine_keys()) {
            if (!g->spans_nodes() || !retired_.Retire(engine_key)) {
              engine_->DestroyGroup(engine_key);
            }
          }
          groups_.erase(gid);
        }
        ledger_.ReleaseMembers(s->info().owner_uid, job.group_members);
        jobs_.Erase(s->info().job());
      }
    }
    const uint64_t buffers = s->buffer_count();
    const uint64_t cleared = s->ClearBuffers();
    ledger_.ReleaseBuffers(s->info().uid, buffers, cleared);
    ledger_.ReleaseSession(s->info().uid);
    version_.fetch_add(1, std::memory_order_release);
  }
  s->Close();
  if (cluster_ != nullptr) {
    cluster_->Withdraw(s->info().job(), {s->info().rank}, ClusterDeadline());
  }
  for (const std::shared_ptr<Group>& g : groups) g->MemberLeft(s.get(), why);
  RunSessionEndHooks(session_id);
  retired_completed_.fetch_add(s->ops_completed());
  retired_failed_.fetch_add(s->ops_failed());
  HSDP_LOG(Info) << "session " << session_id << " (" << s->info().job().Describe() << " rank "
                 << s->info().rank << ") ended: " << why;
}

void SessionManager::AddSessionEndHook(std::function<void(uint64_t)> hook) {
  absl::MutexLock l(&mu_);
  end_hooks_.push_back(std::move(hook));
}

void SessionManager::RunSessionEndHooks(uint64_t session_id) {
  std::vector<std::function<void(uint64_t)>> hooks;
  {
    absl::MutexLock l(&mu_);
    hooks = end_hooks_;
  }
  for (const auto& h : hooks) h(session_id);
}

void SessionManager::EndAll(const std::string& why) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, s] : sessions_) ids.push_back(id);
  }
  // Members waiting in arenas or on operations hear that the daemon is
  // going (UNAVAILABLE: reconnect), before the sessions end: a session's end
  // closes its channel first, and a member that sees it closed before its
  // operation's completion would learn only that the session ended.
  const absl::Status going = absl::UnavailableError(why);
  for (const std::shared_ptr<Group>& g : AllGroups()) {
    g->BreakArena(going);
    g->DaemonLeaving(going);
  }
  // A member may not have read its last completions yet (a drain ends the
  // sessions the moment the last operation completed): the channels keep
  // their pages after the daemon lets them go, so that a completion written
  // for every member reads as one at every member. Released with the last
  // mapping; the daemon is going, and with it their accounting.
  for (uint64_t id : ids) {
    if (std::shared_ptr<Session> s = FindSession(id); s != nullptr) s->channel().KeepPages();
  }
  for (uint64_t id : ids) EndSession(id, why);
}

void SessionManager::Housekeeping() {
  arena_reaper_->Reap();
  {
    absl::MutexLock l(&mu_);
    for (const std::string& key : retired_.TakeDue()) {
      bool live = false;  // created again meanwhile: that one owns the engine state now
      for (auto& [id, g] : groups_) {
        live = live || key == g->key() || key.rfind(g->key() + "/p2p/", 0) == 0;
      }
      if (!live) engine_->DestroyGroup(key);
    }
  }
  std::vector<uint64_t> expired;
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, s] : sessions_) {
      all.push_back(s);
      if (!s->data_connected() && s->AgeSeconds() * 1000 > config_.data_connect_timeout_ms) {
        expired.push_back(id);
      }
    }
  }
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<Session>& s : all) s->ExpireFdWaiters(now);
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

uint64_t SessionManager::retired_groups() const {
  absl::MutexLock l(&mu_);
  return retired_.size();
}

std::vector<JobSummary> SessionManager::Jobs(std::optional<uint32_t> only_uid) const {
  absl::MutexLock l(&mu_);
  return jobs_.Summaries(only_uid);
}

int64_t SessionManager::OpsInFlight() const {
  int64_t n = 0;
  for (const std::shared_ptr<Session>& s : Snapshot()) n += std::max<int64_t>(0, s->ops_in_flight());
  return n;
}

}  // namespace hsdp
