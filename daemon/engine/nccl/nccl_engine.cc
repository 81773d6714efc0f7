#include "daemon/engine/nccl/nccl_engine.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::nccl {
namespace {

constexpr size_t kMaxRememberedTickets = 4096;

bool Reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}
bool HighPriority(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter;
}
const char* CollName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kAllGather: return "all-gather";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kAllToAll: return "all-to-all";
    default: return "unsupported collective";
  }
}

}  // namespace

struct NcclEngine::CommSet {
  std::string key;
  std::string group_key;
  uint32_t epoch = 0;
  std::vector<int> ranks;    // global ranks by member index
  std::vector<int> devices;  // by member index
  std::vector<CommHandle> comms;
  absl::Status broken;       // set once aborted
  bool retire = false;       // release once nothing runs on it
  std::set<uint64_t> running;
  uint64_t last_ticket = 0;  // the set's latest task: the next one runs after it
};

struct NcclEngine::Running {
  uint64_t ticket = 0;
  EngineTask task;
  EngineCallbacks cb;
  std::shared_ptr<CommSet> set;
  std::map<int, device::EventHandle> done;  // device -> the engine's completion event
  std::map<int, device::StreamHandle> streams;  // device -> the stream it ran on
  absl::Time deadline;
  int64_t start_ns = 0;
};

NcclEngine::NcclEngine(device::DeviceApi* dev, Collectives* coll, NcclEngineOptions options)
    : dev_(dev), coll_(coll), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

NcclEngine::~NcclEngine() { Shutdown(); }

absl::Status NcclEngine::ValidateTask(const EngineTask& t, int device_count) {
  switch (t.collective) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kBarrier:
    case Collective::kAllToAll:
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("the nccl engine does not run collective ", static_cast<int>(t.collective)));
  }
  bool all_local = true;
  for (const EngineMember& m : t.members) all_local = all_local && m.local;
  if (!all_local) {
    return absl::UnimplementedError(
        "the nccl engine runs groups whose members are all on this node (cross-node "
        "communicators need the coordinator's unique-id exchange)");
  }
  if (t.members.empty()) return absl::InvalidArgumentError("task has no members");
  if (t.collective == Collective::kBroadcast &&
      (t.root < 0 || t.root >= static_cast<int>(t.members.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", t.root, " is out of range"));
  }
  if (t.collective == Collective::kBarrier) return absl::OkStatus();
  if (DataTypeSize(t.spec.dtype) == 0) return absl::InvalidArgumentError("invalid dtype");
  std::set<int> devices;
  for (size_t i = 0; i < t.members.size(); ++i) {
    const EngineMember& m = t.members[i];
    if (m.send.kind != MemoryKind::kDevice || m.recv.kind != MemoryKind::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", m.global_rank, ": the nccl engine runs on device buffers only"));
    }
    if (m.send.device != m.recv.device || m.send.device < 0 || m.send.device >= device_count) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", m.global_rank, ": device ",
                                                     m.send.device, "/", m.recv.device,
                                                     " is not one device of the ", device_count,
                                                     " this daemon sees"));
    }
    if (!devices.insert(m.send.device).second) {
      return absl::UnimplementedError(absl::StrCat(
          "rank ", m.global_rank, " shares device ", m.send.device,
          " with another member; NCCL needs one GPU per rank in a communicator"));
    }
  }
  if (Reduces(t.collective)) {
    RETURN_IF_ERROR(PlanReduce(t.spec, static_cast<int>(t.members.size())).status());
  }
  return absl::OkStatus();
}

absl::Status NcclEngine::CreateGroup(const EngineGroupSpec& spec) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return absl::UnavailableError("hsdpd is shutting down");
  control_.push_back(Control{Control::kCreate, spec, spec.key, 0, absl::OkStatus()});
  cv_.notify_all();
  return absl::OkStatus();
}

void NcclEngine::DestroyGroup(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  control_.push_back(Control{Control::kDestroy, {}, key, 0, absl::OkStatus()});
  cv_.notify_all();
}

uint64_t NcclEngine::Launch(EngineTask task, EngineCallbacks cb) {
  uint64_t ticket;
  absl::Status refused;
  {
    std::lock_guard<std::mutex> l(mu_);
    ticket = next_ticket_++;
    if (stopping_) {
      refused = absl::UnavailableError("hsdpd is shutting down");
    } else {
      refused = ValidateTask(task, dev_->DeviceCount());
    }
    if (refused.ok()) {
      queue_.push_back(Queued{ticket, std::move(task), std::move(cb)});
      cv_.notify_all();
      return ticket;
    }
    failed_[ticket] = refused;
    ++stats_.tasks_failed;
  }
  cb.launched(ticket);
  cb.completed(refused, 0);
  return ticket;
}

void NcclEngine::Abort(uint64_t ticket, const absl::Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (ticket == 0 || ticket >= next_ticket_) return;
  control_.push_back(Control{Control::kAbort, {}, "", ticket, why});
  cv_.notify_all();
}

void NcclEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && !thread_.joinable()) return;
    if (!stopping_) stop_deadline_ = absl::Now() + options_.shutdown_grace;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

NcclEngineStats NcclEngine::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

device::StreamHandle NcclEngine::StreamOf(int device, bool high) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = streams_.find({device, high});
  return it == streams_.end() ? 0 : it->second;
}

void NcclEngine::Loop() {
  for (;;) {
    std::deque<Control> controls;
    std::deque<Queued> tasks;
    bool stop;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (queue_.empty() && control_.empty()) {
        if (running_.empty()) {
          if (stopping_) break;
          cv_.wait(l, [&] { return stopping_ || !queue_.empty() || !control_.empty(); });
        } else {
          cv_.wait_for(l, absl::ToChronoMicroseconds(options_.poll_interval));
        }
      }
      controls.swap(control_);
      tasks.swap(queue_);
      stop = stopping_;
    }
    (void)stop;
    // Controls before tasks: a CreateGroup queued before a Launch is seen by it.
    for (const Control& c : controls) RunControl(c);
    for (Queued& q : tasks) Issue(std::move(q));
    Poll();
  }
  // Stopped and drained: release everything.
  for (auto& [key, set] : sets_) ReleaseSet(set, !set->broken.ok());
  sets_.clear();
  for (auto& [k, s] : scratch_) (void)dev_->Free(s.ptr);
  scratch_.clear();
  for (const Retired& r : retired_) {
    (void)dev_->Free(r.ptr);
    dev_->DestroyEvent(r.after);
  }
  retired_.clear();
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [k, s] : streams_) dev_->DestroyStream(s);
  streams_.clear();
  for (device::StreamHandle s : dead_streams_) dev_->DestroyStream(s);
  dead_streams_.clear();
}

void NcclEngine::RunControl(const Control& c) {
  switch (c.kind) {
    case Control::kCreate: {
      // Older epochs are retired when the new epoch's communicators exist
      // (they may be shrunk from a healthy old epoch).
      groups_[c.spec.key] = c.spec;
      break;
    }
    case Control::kDestroy: {
      groups_.erase(c.key);
      for (auto& [key, set] : sets_) {
        if (set->group_key == c.key || set->group_key == c.key + "/p2p") set->retire = true;
      }
      break;
    }
    case Control::kAbort: {
      auto it = running_.find(c.ticket);
      if (it != running_.end()) {
        FailSet(it->second->set, c.why);
        break;
      }
      std::optional<Queued> dropped;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (auto q = queue_.begin(); q != queue_.end(); ++q) {
          if (q->ticket == c.ticket) {
            dropped = std::move(*q);
            queue_.erase(q);
            failed_[c.ticket] = c.why;
            break;
          }
        }
      }
      if (dropped.has_value()) {
        dropped->cb.launched(dropped->ticket);
        dropped->cb.completed(c.why, 0);
      }
      break;
    }
  }
  ReleaseRetired();
}

void NcclEngine::ReleaseRetired() {
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (it->second->retire && it->second->running.empty()) {
      ReleaseSet(it->second, !it->second->broken.ok());
      it = sets_.erase(it);
    } else {
      ++it;
    }
  }
}

void NcclEngine::ReleaseSet(const std::shared_ptr<CommSet>& set, bool abort) {
  for (CommHandle c : set->comms) {
    if (c == 0) continue;
    if (abort) {
      (void)coll_->Abort(c);
    } else {
      (void)coll_->Destroy(c);
    }
  }
  set->comms.clear();
}

absl::StatusOr<device::StreamHandle> NcclEngine::Stream(int device, bool high) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = streams_.find({device, high});
    if (it != streams_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(device::StreamHandle s,
                   dev_->CreateStream(device, high ? device::StreamPriority::kHigh
                                                   : device::StreamPriority::kDefault));
  std::lock_guard<std::mutex> l(mu_);
  streams_[{device, high}] = s;
  stream_devices_[s] = device;
  return s;
}

absl::StatusOr<device::DevicePtr> NcclEngine::Scratch(device::StreamHandle stream, int device,
                                                      int slot, uint64_t bytes) {
  // Stream-ordered reuse: every task on `stream` uses its slots in stream
  // order, so one buffer per (stream, slot) is enough. A buffer that is too
  // small is retired behind an event and freed once the stream passed it.
  ScratchBuf& s = scratch_[{stream, slot}];
  if (s.bytes >= bytes) return s.ptr;
  if (s.ptr != 0) {
    ASSIGN_OR_RETURN(device::EventHandle e, dev_->CreateEvent(device, false));
    RETURN_IF_ERROR(dev_->RecordEvent(e, stream));
    retired_.push_back(Retired{s.ptr, e});
    s = ScratchBuf{};
  }
  const uint64_t want = std::max<uint64_t>(bytes, 1 << 20);
  ASSIGN_OR_RETURN(s.ptr, dev_->Allocate(device, want));
  s.bytes = want;
  return s.ptr;
}

absl::StatusOr<std::shared_ptr<NcclEngine::CommSet>> NcclEngine::CommsFor(const EngineTask& t) {
  std::vector<int> ranks, devices;
  for (const EngineMember& m : t.members) {
    ranks.push_back(m.global_rank);
    devices.push_back(m.send.device);
  }
  const std::string key = absl::StrCat(t.group_key, "#", t.epoch, "#", absl::StrJoin(ranks, ","));
  if (auto it = sets_.find(key); it != sets_.end()) {
    const std::shared_ptr<CommSet>& set = it->second;
    if (!set->broken.ok()) {
      return absl::Status(set->broken.code(),
                          absl::StrCat("this group epoch failed earlier: ", set->broken.message()));
    }
    if (t.collective != Collective::kBarrier && set->devices != devices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", t.group_key, ": a member's device changed within the epoch (was ",
          absl::StrJoin(set->devices, ","), ", now ", absl::StrJoin(devices, ","), ")"));
    }
    return set;
  }
  if (t.collective == Collective::kBarrier) {
    return std::shared_ptr<CommSet>();  // a barrier moves nothing: no communicator needed
  }
  auto set = std::make_shared<CommSet>();
  set->key = key;
  set->group_key = t.group_key;
  set->epoch = t.epoch;
  set->ranks = ranks;
  set->devices = devices;
  // Survivors of a healthy older epoch: shrink it (cheaper than a new init).
  std::shared_ptr<CommSet> old;
  for (auto& [k, s] : sets_) {
    if (s->group_key == t.group_key && s->epoch < t.epoch && s->broken.ok() &&
        s->running.empty() && !s->comms.empty()) {
      old = s;
    }
  }
  bool shrunk = false;
  if (old != nullptr && coll_->SupportsShrink() && old->ranks.size() > ranks.size()) {
    std::vector<int> exclude;
    std::vector<int> kept_ranks, kept_devices;
    for (size_t i = 0; i < old->ranks.size(); ++i) {
      if (std::find(ranks.begin(), ranks.end(), old->ranks[i]) == ranks.end()) {
        exclude.push_back(static_cast<int>(i));
      } else {
        kept_ranks.push_back(old->ranks[i]);
        kept_devices.push_back(old->devices[i]);
      }
    }
    if (kept_ranks == ranks && kept_devices == devices) {
      auto comms = coll_->ShrinkRanks(old->comms, exclude);
      if (comms.ok()) {
        set->comms = *std::move(comms);
        shrunk = true;
      } else {
        HSDP_LOG(Warning) << "ncclCommShrink for " << t.group_key << " failed ("
                          << comms.status().message() << "); creating new communicators";
      }
    }
  }
  if (!shrunk) {
    ASSIGN_OR_RETURN(UniqueId id, coll_->NewUniqueId());
    std::vector<int> local_ranks(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) local_ranks[i] = static_cast<int>(i);
    ASSIGN_OR_RETURN(set->comms,
                     coll_->InitRanks(id, static_cast<int>(ranks.size()), local_ranks, devices));
  }
  // Non-blocking init: poll until every communicator is ready.
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  for (size_t i = 0; i < set->comms.size();) {
    absl::Status err;
    const AsyncState st = coll_->Query(set->comms[i], &err);
    if (st == AsyncState::kReady) {
      ++i;
      continue;
    }
    if (st == AsyncState::kFailed || absl::Now() > deadline) {
      ReleaseSet(set, true);
      return st == AsyncState::kFailed
                 ? absl::Status(err.code(), absl::StrCat("communicator init for group ",
                                                         t.group_key, " failed: ", err.message()))
                 : absl::DeadlineExceededError(absl::StrCat("communicator init for group ",
                                                            t.group_key, " timed out"));
    }
    absl::SleepFor(options_.poll_interval);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ++(shrunk ? stats_.comm_shrinks : stats_.comm_inits);
  }
  for (auto& [k, s] : sets_) {
    if (s->group_key == t.group_key && s->epoch < t.epoch) s->retire = true;
  }
  sets_[key] = set;
  return set;
}

void NcclEngine::Issue(Queued q) {
  auto run = std::make_unique<Running>();
  run->ticket = q.ticket;
  run->start_ns = shm::NowNanos();
  run->deadline = absl::Now() + options_.op_timeout;
  absl::Status s = IssueOrError(q, *run);
  run->task = std::move(q.task);
  run->cb = std::move(q.cb);
  if (!s.ok()) {
    for (auto& [d, e] : run->done) dev_->DestroyEvent(e);
    run->done.clear();
    run->cb.launched(run->ticket);
    Finish(std::move(run), s);
    return;
  }
  if (run->set != nullptr) {
    run->set->running.insert(run->ticket);
    run->set->last_ticket = run->ticket;
  }
  run->cb.launched(run->ticket);
  {
    std::lock_guard<std::mutex> l(mu_);
    busy_ = true;
  }
  running_[run->ticket] = std::move(run);
}

absl::Status NcclEngine::IssueOrError(Queued& q, Running& run) {
  const EngineTask& t = q.task;
  const int n = static_cast<int>(t.members.size());
  // Dependencies: failed ones fail this task; running ones are waited on by
  // the device (their completion events), never by this thread.
  std::map<int, std::vector<device::EventHandle>> dep_events;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t dep : t.depends_on) {
      if (auto it = failed_.find(dep); it != failed_.end()) {
        return absl::Status(it->second.code(),
                            absl::StrCat("an operation this one depends on failed: ",
                                         it->second.message()));
      }
    }
  }
  for (uint64_t dep : t.depends_on) {
    if (auto it = running_.find(dep); it != running_.end()) {
      for (const auto& [d, e] : it->second->done) dep_events[d].push_back(e);
    }
  }
  ASSIGN_OR_RETURN(run.set, CommsFor(t));
  const bool high = HighPriority(t.collective);
  // A group's tasks run in launch order: on the same stream that is stream
  // order; on another stream (the other priority, or a stream that replaced
  // one after a failure) the device waits for the previous task.
  const Running* prev = nullptr;
  if (run.set != nullptr && run.set->last_ticket != 0) {
    if (auto it = running_.find(run.set->last_ticket); it != running_.end()) prev = it->second.get();
  }
  std::vector<device::StreamHandle> streams(n);
  for (int r = 0; r < n; ++r) {
    const EngineMember& m = t.members[r];
    if (m.send.kind != MemoryKind::kDevice || m.send.device < 0) continue;  // barrier
    const int d = m.send.device;
    ASSIGN_OR_RETURN(streams[r], Stream(d, high));
    run.streams[d] = streams[r];
    if (prev != nullptr) {
      auto ps = prev->streams.find(d);
      auto pe = prev->done.find(d);
      if (ps != prev->streams.end() && ps->second != streams[r] && pe != prev->done.end()) {
        dep_events[d].push_back(pe->second);
      }
    }
    // Never launch before the producer is done.
    if (m.wait_event != 0) RETURN_IF_ERROR(dev_->StreamWaitEvent(streams[r], m.wait_event));
    for (device::EventHandle e : dep_events[d]) RETURN_IF_ERROR(dev_->StreamWaitEvent(streams[r], e));
  }
  const DataType dt = t.spec.dtype;
  const size_t es = DataTypeSize(dt);
  if (t.collective != Collective::kBarrier && (t.count > 0 || t.collective == Collective::kAllToAll)) {
    DeviceReducePlan plan;
    plan.wire = dt;
    if (Reduces(t.collective)) {
      ASSIGN_OR_RETURN(plan, PlanReduce(t.spec, n));
    }
    const bool rs = t.collective == Collective::kReduceScatter;
    const uint64_t in_count = rs ? t.count * n : t.count;
    const size_t ws = DataTypeSize(plan.wire);
    // Operands of the collective per member (scratch when the wire dtype differs).
    std::vector<device::DevicePtr> cin(n), cout(n);
    for (int r = 0; r < n; ++r) {
      const EngineMember& m = t.members[r];
      const auto send = reinterpret_cast<device::DevicePtr>(m.send.data);
      const auto recv = reinterpret_cast<device::DevicePtr>(m.recv.data);
      cin[r] = send;
      cout[r] = recv;
      if (!plan.cast) continue;
      ASSIGN_OR_RETURN(cin[r], Scratch(streams[r], m.send.device, 0, in_count * ws));
      cout[r] = cin[r];
      if (rs) {
        ASSIGN_OR_RETURN(cout[r], Scratch(streams[r], m.send.device, 1, t.count * ws));
      }
      RETURN_IF_ERROR(dev_->ScaleCastAsync(send, dt, cin[r], plan.wire, in_count, plan.in_scale,
                                           streams[r]));
    }
    std::vector<RedOp> ops(n, RedOp{plan.op, -1});
    if (plan.op == ReduceOp::kPremulSum) {
      for (int r = 0; r < n; ++r) {
        ASSIGN_OR_RETURN(ops[r], coll_->CreatePreMulSum(plan.premul, plan.wire, run.set->comms[r]));
      }
    }
    absl::Status issued = coll_->GroupStart();
    for (int r = 0; r < n && issued.ok(); ++r) {
      const EngineMember& m = t.members[r];
      const CommHandle c = run.set->comms[r];
      switch (t.collective) {
        case Collective::kAllReduce:
          issued = coll_->AllReduce(cin[r], cout[r], t.count, plan.wire, ops[r], c, streams[r]);
          break;
        case Collective::kReduceScatter:
          issued = coll_->ReduceScatter(cin[r], cout[r], t.count, plan.wire, ops[r], c, streams[r]);
          break;
        case Collective::kAllGather:
          issued = coll_->AllGather(cin[r], cout[r], t.count, dt, c, streams[r]);
          break;
        case Collective::kBroadcast:
          issued = coll_->Broadcast(cin[r], cout[r], t.count, dt, t.root, c, streams[r]);
          break;
        case Collective::kAllToAll: {
          // Block j of member r goes to member j; uneven blocks are prefix sums.
          uint64_t soff = 0, roff = 0;
          for (int j = 0; j < n && issued.ok(); ++j) {
            const uint64_t sc = m.send_counts.empty() ? t.count : m.send_counts[j];
            const uint64_t rc = m.recv_counts.empty() ? t.count : m.recv_counts[j];
            issued = coll_->Send(cin[r] + soff * es, sc, dt, j, c, streams[r]);
            if (issued.ok()) issued = coll_->Recv(cout[r] + roff * es, rc, dt, j, c, streams[r]);
            soff += sc;
            roff += rc;
          }
          break;
        }
        default:
          issued = absl::InternalError("unreachable collective");
      }
    }
    absl::Status ended = coll_->GroupEnd();
    if (issued.ok()) issued = ended;
    if (plan.op == ReduceOp::kPremulSum) {
      for (int r = 0; r < n; ++r) coll_->DestroyRedOp(ops[r], run.set->comms[r]);
    }
    // Non-blocking communicators: no call may follow on a communicator until
    // it left the in-progress state the group call may have left it in.
    if (issued.ok()) issued = WaitIssued(*run.set);
    if (!issued.ok()) {
      // Partially issued work may be stuck in the communicators: abort them.
      FailSet(run.set, issued);
      return issued;
    }
    for (int r = 0; r < n; ++r) {
      const auto recv = reinterpret_cast<device::DevicePtr>(t.members[r].recv.data);
      if (plan.cast) {
        RETURN_IF_ERROR(dev_->ScaleCastAsync(cout[r], plan.wire, recv, dt, t.count, plan.out_scale,
                                             streams[r]));
      } else if (plan.out_scale != 1.0) {
        RETURN_IF_ERROR(
            dev_->ScaleCastAsync(recv, dt, recv, dt, t.count, plan.out_scale, streams[r]));
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const EngineMember& m = t.members[r];
    const int d = m.send.kind == MemoryKind::kDevice ? m.send.device : -1;
    if (d < 0) continue;
    if (streams[r] == 0) {
      ASSIGN_OR_RETURN(streams[r], Stream(d, high));
    }
    if (run.done.find(d) == run.done.end()) {
      ASSIGN_OR_RETURN(device::EventHandle e, dev_->CreateEvent(d, false));
      run.done[d] = e;
      RETURN_IF_ERROR(dev_->RecordEvent(e, streams[r]));
    }
    if (m.done_event != 0) RETURN_IF_ERROR(dev_->RecordEvent(m.done_event, streams[r]));
  }
  return absl::OkStatus();
}

absl::Status NcclEngine::WaitIssued(const CommSet& set) {
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  for (CommHandle c : set.comms) {
    for (;;) {
      absl::Status err;
      const AsyncState st = coll_->Query(c, &err);
      if (st == AsyncState::kReady) break;
      if (st == AsyncState::kFailed) return err;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("group ", set.group_key, ": the group call stayed in progress"));
      }
      absl::SleepFor(options_.poll_interval);
    }
  }
  return absl::OkStatus();
}

void NcclEngine::Poll() {
  // Asynchronous communicator errors (a lost peer) first.
  std::vector<std::pair<std::shared_ptr<CommSet>, absl::Status>> broken;
  for (auto& [key, set] : sets_) {
    if (!set->broken.ok() || set->running.empty()) continue;
    for (CommHandle c : set->comms) {
      absl::Status err;
      if (coll_->Query(c, &err) == AsyncState::kFailed) {
        broken.emplace_back(set, absl::Status(err.code(), absl::StrCat(
                                                  "communicator error in group ", set->group_key,
                                                  ": ", err.message())));
        break;
      }
    }
  }
  for (auto& [set, why] : broken) FailSet(set, why);
  absl::Time now = absl::Now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && now > stop_deadline_) now = absl::InfiniteFuture();  // everything is late
  }
  std::vector<uint64_t> done, late;
  std::vector<std::pair<uint64_t, absl::Status>> errored;
  for (auto& [ticket, run] : running_) {
    bool all = true;
    absl::Status err;
    for (auto& [d, e] : run->done) {
      absl::StatusOr<bool> ok = dev_->EventDone(e);
      if (!ok.ok()) {
        err = ok.status();
        break;
      }
      all = all && *ok;
    }
    if (!err.ok()) {
      errored.emplace_back(ticket, err);
    } else if (all) {
      done.push_back(ticket);
    } else if (now > run->deadline) {
      late.push_back(ticket);
    }
  }
  for (uint64_t t : done) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    std::unique_ptr<Running> run = std::move(it->second);
    running_.erase(it);
    Finish(std::move(run), absl::OkStatus());
  }
  for (auto& [t, err] : errored) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    if (it->second->set != nullptr) {
      FailSet(it->second->set, err);
    } else {
      std::unique_ptr<Running> run = std::move(it->second);
      running_.erase(it);
      Finish(std::move(run), err);
    }
  }
  for (uint64_t t : late) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    const absl::Status why =
        now == absl::InfiniteFuture()
            ? absl::UnavailableError(absl::StrCat(
                  "hsdpd is shutting down: ", CollName(it->second->task.collective),
                  " in group ", it->second->task.group_key,
                  " was still running after the grace period; its communicators were aborted"))
            : absl::DeadlineExceededError(absl::StrCat(
                  CollName(it->second->task.collective), " in group ",
                  it->second->task.group_key, " did not finish within ",
                  absl::FormatDuration(options_.op_timeout), "; its communicators were aborted"));
    if (it->second->set != nullptr) {
      FailSet(it->second->set, why);
    } else {
      std::unique_ptr<Running> run = std::move(it->second);
      running_.erase(it);
      Finish(std::move(run), why);
    }
  }
  // Scratch retired behind an event.
  for (auto it = retired_.begin(); it != retired_.end();) {
    absl::StatusOr<bool> ok = dev_->EventDone(it->after);
    if (!ok.ok() || *ok) {
      (void)dev_->Free(it->ptr);
      dev_->DestroyEvent(it->after);
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
  ReleaseRetired();
  std::lock_guard<std::mutex> l(mu_);
  busy_ = !running_.empty();
}

void NcclEngine::FailSet(const std::shared_ptr<CommSet>& set, const absl::Status& why) {
  if (set == nullptr) return;
  if (set->broken.ok()) {
    set->broken = why;
    HSDP_LOG(Warning) << "aborting the communicators of " << set->group_key << " epoch "
                      << set->epoch << ": " << why.message();
    ReleaseSet(set, /*abort=*/true);
    // Work stuck on the set's streams (a producer event that never fires, a
    // kernel of the aborted communicators) must not hold back later tasks:
    // they get fresh streams; the old ones are released at shutdown.
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.comm_aborts;
    for (int d : set->devices) {
      for (bool hi : {false, true}) {
        auto it = streams_.find({d, hi});
        if (it == streams_.end()) continue;
        dead_streams_.push_back(it->second);
        stream_devices_.erase(it->second);
        streams_.erase(it);
      }
    }
  }
  const std::set<uint64_t> tickets = set->running;
  for (uint64_t t : tickets) {
    auto it = running_.find(t);
    if (it == running_.end()) continue;
    std::unique_ptr<Running> run = std::move(it->second);
    running_.erase(it);
    Finish(std::move(run), why);
  }
}

void NcclEngine::Finish(std::unique_ptr<Running> run, absl::Status status) {
  if (run->set != nullptr) run->set->running.erase(run->ticket);
  // An aborted task's events may never complete (fake streams: they will,
  // once the abort released them); destroying an event is always safe.
  for (auto& [d, e] : run->done) dev_->DestroyEvent(e);
  const uint64_t exec_ns = static_cast<uint64_t>(shm::NowNanos() - run->start_ns);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (status.ok()) {
      ++stats_.tasks_completed;
    } else {
      ++stats_.tasks_failed;
      failed_[run->ticket] = status;
      while (failed_.size() > kMaxRememberedTickets) failed_.erase(failed_.begin());
    }
  }
  run->cb.completed(std::move(status), exec_ns);
}

}  // namespace hsdp::nccl
