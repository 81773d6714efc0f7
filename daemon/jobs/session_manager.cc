#include "daemon/jobs/session_manager.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <cstdio>

#include "absl/strings/str_join.h"
#include "daemon/util/executor.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/version.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

constexpr int kMaxWorldSize = 1 << 20;
constexpr absl::Duration kFdArrivalTimeout = absl::Seconds(5);

std::string FormatBytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrCat(b, " bytes (", b >> 30, " GiB)");
  if (b >= (1ull << 20)) return absl::StrCat(b, " bytes (", b >> 20, " MiB)");
  return absl::StrCat(b, " bytes");
}

// a + b without wrapping (for messages and comparisons).
uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

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
    return absl::FailedPreconditionError(absl::StrCat(
        "features: the client offers 0x", absl::Hex(p.features), ", this hsdpd (", kHsdpVersion,
        ") requires 0x", absl::Hex(shm::kFeaturesRequired),
        "; use a client library and daemon of matching versions"));
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

SessionManager::SessionManager(const NodeConfig& config, NodeLimits limits, Engine* engine,
                               Executor* control, OpObserver* observer, ClusterDirectory* cluster)
    : config_(config), limits_(limits), engine_(engine), control_(control), observer_(observer),
      cluster_(cluster) {}

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
  ASSIGN_OR_RETURN(JobChoice choice,
                   jobs_.Choose(p.job_id,
                                AttachIdentity{caller.uid, p.caller_is_admin, p.owner_uid},
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

absl::StatusOr<AttachResult> SessionManager::Attach(const AttachParams& p, const PeerCred& caller) {
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
    return absl::ResourceExhaustedError(absl::StrCat(
        "this hsdpd already has ", sessions_.size(), " sessions (limits.max_sessions)"));
  }
  if (choice.join_only && cluster_ == nullptr && jobs_.Find(choice.key) == nullptr) {
    // Its last rank left since ChooseJobLocked: root never creates it.
    return absl::NotFoundError(absl::StrCat("owner_uid: ", choice.key.Describe(),
                                            " is no longer attached on this node"));
  }
  RETURN_IF_ERROR(CheckJoinLocked(choice.key, p));
  if (node_mappings_ >= limits_.max_mappings) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this node already has ", node_mappings_, " shared-memory mappings (the budget below "
        "vm.max_map_count is ", limits_.max_mappings, ")"));
  }
  const uint64_t id = next_session_id_++;
  const uint64_t features = p.features & (shm::kFeaturesImplemented | extra_features_.load());
  ASSIGN_OR_RETURN(std::unique_ptr<ShmChannel> channel,
                   ShmChannel::Create(id, config_.ring_entries, features));
  SessionInfo info{p.job_id,  p.rank,     p.world_size, p.local_rank, p.device,
                   p.pid,     caller.uid, caller.gid,   features,     choice.key.owner_uid};
  const SessionToken token = NewToken();
  auto session = std::make_shared<Session>(id, info, token, std::move(channel));
  Job& job = jobs_.FindOrAdd(choice.key);
  job.world_size = p.world_size;
  job.rank_to_session[p.rank] = id;
  sessions_[id] = session;
  ++node_mappings_;
  version_.fetch_add(1, std::memory_order_release);
  HSDP_LOG(Info) << "session " << id << " attached: " << choice.key.Describe() << " rank "
                 << p.rank << "/" << p.world_size << " pid " << p.pid << " uid " << caller.uid
                 << " device " << p.device;
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
    if (size_bytes > limits_.max_node_bytes ||
        node_bytes_ > limits_.max_node_bytes - size_bytes) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "a buffer of ", FormatBytes(size_bytes), " would bring this node to ",
          FormatBytes(SaturatingAdd(node_bytes_, size_bytes)), ", over the node limit of ",
          FormatBytes(limits_.max_node_bytes), " (limits.max_node_bytes)")));
    }
    if (node_mappings_ >= limits_.max_mappings) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "this node already has ", node_mappings_, " shared-memory mappings (the budget below "
          "vm.max_map_count is ", limits_.max_mappings, ")")));
    }
    if (absl::Status r = s->ReserveBuffer(size_bytes, config_.max_session_bytes,
                                          config_.max_buffers_per_session);
        !r.ok()) {
      return done(r);
    }
    if (fd_tag == 0) {
      s->ReleaseReservation(size_bytes);
      return done(uint64_t{0});
    }
    node_bytes_ += size_bytes;  // reserved now; committed or released below
    ++node_mappings_;
  }
  auto finish = [this, s, size_bytes, name, done](absl::StatusOr<UniqueFd> fd) {
    auto work = [this, s, size_bytes, name, done, fd = std::make_shared<absl::StatusOr<UniqueFd>>(
                                                      std::move(fd))]() mutable {
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
    ReleaseNode(size_bytes, 1);
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
  s->ReleaseReservation(size_bytes);
  if (buf.ok() && s->closed()) {
    buf = absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  if (!buf.ok()) {
    ReleaseNode(size_bytes, 1);
    return buf.status();
  }
  const uint64_t id = s->AddBuffer(std::move(*buf));
  if (id == 0) {  // ended while mapping: its ClearBuffers did not count this one
    ReleaseNode(size_bytes, 1);
    return absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  HSDP_LOG(Debug) << "session " << s->id() << " registered buffer " << id << " (" << size_bytes
                  << " bytes)";
  return id;
}

void SessionManager::ReleaseNode(uint64_t bytes, uint64_t mappings) {
  absl::MutexLock l(&mu_);
  node_bytes_ -= bytes;
  node_mappings_ -= mappings;
}

absl::StatusOr<uint64_t> SessionManager::RegisterBufferSync(uint64_t session_id, uint64_t fd_tag,
                                                            uint64_t size_bytes,
                                                            const std::string& name,
                                                            const PeerCred& caller) {
  absl::Mutex mu;
  std::optional<absl::StatusOr<uint64_t>> result;
  RegisterBuffer(session_id, fd_tag, size_bytes, name, caller,
                 [&](absl::StatusOr<uint64_t> r) {
                   absl::MutexLock l(&mu);
                   result = std::move(r);
                 });
  absl::MutexLock l(&mu);
  mu.Await(absl::Condition(+[](std::optional<absl::StatusOr<uint64_t>>* r) { return r->has_value(); },
                           &result));
  return *std::move(result);
}

absl::Status SessionManager::FreeBuffer(uint64_t session_id, uint64_t buffer_id,
                                        const PeerCred& caller) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Lookup(session_id, caller));
  ASSIGN_OR_RETURN(std::shared_ptr<MappedBuffer> b, s->RemoveBuffer(buffer_id));
  node_bytes_ -= b->size();
  --node_mappings_;
  return absl::OkStatus();  // unmapped when the last in-flight op lets go
}

absl::StatusOr<NewGroupResult> SessionManager::NewGroup(uint64_t session_id,
                                                        const std::vector<int>& ranks,
                                                        const PeerCred& caller,
                                                        uint32_t rejoin_group_id) {
  std::shared_ptr<Group> group;
  std::shared_ptr<Session> s;
  std::string key;
  int k = 0;
  bool all_here = false;  // every rank attached to this daemon: no placement lookup
  {
    absl::MutexLock l(&mu_);
    ASSIGN_OR_RETURN(s, Lookup(session_id, caller));
    Job& job = *jobs_.Find(s->info().job());  // a live session's job exists
    if (rejoin_group_id != 0) {
      auto it = groups_.find(rejoin_group_id);
      if (it == groups_.end() || it->second->job() != s->info().job()) {
        return absl::NotFoundError(
            absl::StrCat("rejoin_group_id: ", s->info().job().Describe(), " has no group ",
                         rejoin_group_id));
      }
      if (!ranks.empty() && ranks != it->second->ranks()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks: group ", rejoin_group_id, " has other ranks; pass its ranks or none"));
      }
      group = it->second;
    } else {
      if (ranks.empty()) return absl::InvalidArgumentError("ranks: must not be empty");
      if (ranks.size() > static_cast<size_t>(job.world_size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks: ", ranks.size(), " ranks in a job of world size ", job.world_size));
      }
      bool has_caller = false;
      {
        std::vector<bool> seen(job.world_size, false);  // bounded by the job's world size
        for (size_t i = 0; i < ranks.size(); ++i) {
          if (ranks[i] < 0 || ranks[i] >= job.world_size) {
            return absl::InvalidArgumentError(absl::StrCat("ranks[", i, "]: ", ranks[i],
                                                           " is outside [0, world_size=",
                                                           job.world_size, ")"));
          }
          if (seen[ranks[i]]) {
            return absl::InvalidArgumentError(
                absl::StrCat("ranks[", i, "]: rank ", ranks[i], " appears twice"));
          }
          seen[ranks[i]] = true;
          if (ranks[i] == s->info().rank) has_caller = true;
        }
      }
      if (!has_caller) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks: the caller's rank ", s->info().rank, " is not in the list of ", ranks.size(),
            " ranks; only members call NewGroup"));
      }
      auto call_it = job.calls.find({session_id, ranks});
      k = call_it == job.calls.end() ? 0 : call_it->second;
      key = GroupKey(s->info().job(), ranks, k);
      auto it = job.groups.find(key);
      if (it != job.groups.end()) {
        group = groups_.at(it->second);
        job.calls[{session_id, ranks}] = k + 1;  // counted only once accepted
      } else if (job.groups.size() >= config_.max_groups_per_job) {
        // Checked again when creating; early here, before any network wait.
        return absl::ResourceExhaustedError(absl::StrCat(
            s->info().job().Describe(), " already has ", job.groups.size(),
            " groups (limits.max_groups_per_job)"));
      }
      all_here = std::all_of(ranks.begin(), ranks.end(),
                             [&](int r) { return job.rank_to_session.count(r) > 0; });
    }
  }
  if (group == nullptr) {
    // Where every rank is (a network wait in a cluster; no lock held).
    std::vector<int> nodes;
    int this_node = 0;
    uint32_t first_epoch = 1;
    if (cluster_ != nullptr && all_here) {
      this_node = cluster_->this_node();
    } else if (cluster_ != nullptr) {
      // Each wait holds a gRPC thread: bounded, so waiting groups cannot
      // take every thread of the daemon.
      if (placement_waits_.fetch_add(1) >= kMaxPlacementWaits) {
        placement_waits_.fetch_sub(1);
        return absl::ResourceExhaustedError(absl::StrCat(
            "ranks: ", kMaxPlacementWaits, " NewGroup calls already wait for their ranks to "
            "attach somewhere in the cluster; retry"));
      }
      const absl::Time deadline = ClusterDeadline();
      absl::StatusOr<std::vector<int>> resolved =
          cluster_->Resolve(s->info().job(), ranks, deadline);
      placement_waits_.fetch_sub(1);
      ASSIGN_OR_RETURN(nodes, std::move(resolved));
      this_node = cluster_->this_node();
      if (std::all_of(nodes.begin(), nodes.end(), [&](int n) { return n == this_node; })) {
        nodes.clear();  // all here: a single-node group, as without a cluster
      } else {
        ASSIGN_OR_RETURN(first_epoch, cluster_->FirstEpoch(key, deadline));
      }
    }
    ASSIGN_OR_RETURN(group, CreateGroup(s, ranks, key, k, std::move(nodes), this_node,
                                        first_epoch));
  }
  const int group_rank = group->RankOf(s->info().rank);
  if (group_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rejoin_group_id: rank ", s->info().rank,
                                                   " is not a member of group ", group->id()));
  }
  ASSIGN_OR_RETURN(const uint32_t epoch, group->Join(group_rank, s));
  return NewGroupResult{group->id(), group_rank, group->size(), epoch};
}

absl::StatusOr<std::shared_ptr<Group>> SessionManager::CreateGroup(
    const std::shared_ptr<Session>& s, const std::vector<int>& ranks, const std::string& key, int k,
    std::vector<int> nodes, int this_node, uint32_t first_epoch) {
  absl::MutexLock l(&mu_);
  Job* job_ptr = jobs_.Find(s->info().job());
  if (s->closed() || job_ptr == nullptr) {
    return absl::NotFoundError(absl::StrCat("session_id: session ", s->id(), " ended"));
  }
  Job& job = *job_ptr;
  std::shared_ptr<Group> group;
  if (auto it = job.groups.find(key); it != job.groups.end()) {
    group = groups_.at(it->second);  // another member created it meanwhile
  } else {
    if (job.groups.size() >= config_.max_groups_per_job) {
      return absl::ResourceExhaustedError(absl::StrCat(
          s->info().job().Describe(), " already has ", job.groups.size(),
          " groups (limits.max_groups_per_job)"));
    }
    if (job.group_members + ranks.size() > limits_.max_group_members_per_job ||
        node_group_members_ + ranks.size() > limits_.max_group_members) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a group of ", ranks.size(), " ranks would bring ", s->info().job().Describe(),
          " to ", job.group_members + ranks.size(), " group members (at most ",
          limits_.max_group_members_per_job, " per job and ", limits_.max_group_members,
          " per node, ", node_group_members_, " in use)"));
    }
    if (!nodes.empty() && !engine_->SupportsRemoteMembers()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ranks: the group spans nodes, but this hsdpd's engine (", engine_->name(),
          ") cannot reach other nodes (built without the cross-node engine?)"));
    }
    const uint32_t id = next_group_id_++;
    GroupSpec spec;
    spec.id = id;
    spec.key = key;
    spec.job_id = s->info().job_id;
    spec.owner_uid = s->info().owner_uid;
    spec.ranks = ranks;
    spec.nodes = nodes;
    spec.this_node = this_node;
    spec.first_epoch = first_epoch;
    spec.timeout_ns = int64_t{config_.collective_timeout_ms} * 1'000'000;
    spec.max_pending = config_.ring_entries;
    spec.observer = observer_;
    if (cluster_ != nullptr && !nodes.empty()) {
      ClusterDirectory* cluster = cluster_;
      spec.on_epoch_failed = [cluster, key](uint32_t epoch, const absl::Status& why) {
        cluster->ReportEpochFailed(key, epoch, std::string(why.message()));
      };
    }
    if (nodes.empty()) nodes.assign(ranks.size(), this_node);
    group = std::make_shared<Group>(std::move(spec), engine_,
                                    [this](uint32_t gid) { return FindGroup(gid); });
    EngineGroupSpec es{key, first_epoch, ranks, std::move(nodes), this_node};
    RETURN_IF_ERROR(engine_->CreateGroup(es));
    groups_[id] = group;
    job.groups[key] = id;
    job.group_members += ranks.size();
    node_group_members_ += ranks.size();
    if (group->spans_nodes()) {
      HSDP_LOG(Info) << "group " << id << " (" << s->info().job().Describe() << ", "
                     << ranks.size() << " ranks) spans nodes; epoch " << first_epoch;
    }
  }
  job.calls[{s->id(), ranks}] = k + 1;  // counted only once accepted
  return group;
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
    if (Job* job_ptr = jobs_.Find(s->info().job()); job_ptr != nullptr) {
      Job& job = *job_ptr;
      job.rank_to_session.erase(s->info().rank);
      for (auto& [key, gid] : job.groups) groups.push_back(groups_.at(gid));
      if (job.rank_to_session.empty()) {
        const absl::Time later =
            absl::Now() + absl::Milliseconds(2 * int64_t{config_.cluster_heartbeat_ms} + 500);
        for (auto& [key, gid] : job.groups) {
          // A group that spans nodes keeps its engine state (its links) a
          // little longer, so the other daemons learn why from this node's
          // report rather than from a connection reset.
          const std::shared_ptr<Group>& g = groups_.at(gid);
          for (const std::string& engine_key : g->engine_keys()) {
            if (g->spans_nodes() && retired_.size() < kMaxRetiredGroups) {
              retired_.emplace_back(engine_key, later);
            } else {
              engine_->DestroyGroup(engine_key);
            }
          }
          groups_.erase(gid);
        }
        node_group_members_ -= job.group_members;
        jobs_.Erase(s->info().job());
      }
    }
    node_mappings_ -= 1 + s->buffer_count();
    node_bytes_ -= s->ClearBuffers();
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
  for (uint64_t id : ids) EndSession(id, why);
}

void SessionManager::OnPeerLost(int node, const std::string& why) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, g] : groups_) groups.push_back(g);
  }
  for (const std::shared_ptr<Group>& g : groups) g->PeerLost(node, why);
}

void SessionManager::OnPeerJoined(int node) {
  for (const std::shared_ptr<Group>& g : AllGroups()) g->PeerJoined(node);
}

void SessionManager::OnGroupEvent(const std::string& key, uint32_t epoch, int origin,
                                  const std::string& why) {
  std::vector<std::shared_ptr<Group>> groups;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, g] : groups_) {
      if (g->key() == key && g->spans_nodes()) groups.push_back(g);
    }
  }
  for (const std::shared_ptr<Group>& g : groups) {
    // `why` comes from the origin's daemon (its group ids are its own).
    g->RemoteEpochFailed(epoch, absl::AbortedError(absl::StrCat("node ", origin, " reports: ",
                                                                why)));
  }
}

void SessionManager::Housekeeping() {
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    while (!retired_.empty() && retired_.front().second <= now) {
      const std::string& key = retired_.front().first;
      bool live = false;  // created again meanwhile: that one owns the engine state now
      for (auto& [id, g] : groups_) {
        live = live || key == g->key() || key.rfind(g->key() + "/p2p/", 0) == 0;
      }
      if (!live) engine_->DestroyGroup(key);
      retired_.pop_front();
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

std::vector<JobSummary> SessionManager::Jobs(std::optional<uint32_t> only_uid) const {
  absl::MutexLock l(&mu_);
  return jobs_.Summaries(only_uid);
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
