// The NCCL engine's issuing half: communicator sets, streams, scratch
// buffers, and turning one task into device waits, kernels and one group
// call (see nccl_engine.h).
#include "daemon/engine/nccl/nccl_engine.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
#include "daemon/engine/nccl/shared_device_plan.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::nccl {

absl::StatusOr<device::StreamHandle> NcclEngine::Stream(CommSet& set, int device, bool high) {
  auto it = set.streams.find({device, high});
  if (it != set.streams.end()) return it->second;
  ASSIGN_OR_RETURN(device::StreamHandle s,
                   dev_->CreateStream(device, high ? device::StreamPriority::kHigh
                                                   : device::StreamPriority::kDefault));
  set.streams[{device, high}] = s;
  std::lock_guard<std::mutex> l(mu_);
  stream_index_[{set.group_key, device, high}] = s;
  return s;
}

absl::StatusOr<device::DevicePtr> NcclEngine::Scratch(CommSet& set, device::StreamHandle stream,
                                                      int device, int slot, uint64_t bytes) {
  // Stream-ordered reuse: every task on `stream` uses its slots in stream
  // order, so one buffer per (stream, slot) is enough. A buffer that is too
  // small is retired behind an event and freed once the stream passed it.
  CommSet::ScratchBuf& s = set.scratch[{stream, slot}];
  if (s.bytes >= bytes) return s.ptr;
  if (s.ptr != 0) {
    ASSIGN_OR_RETURN(device::EventHandle e, dev_->CreateEvent(device, false));
    if (absl::Status r = dev_->RecordEvent(e, stream); !r.ok()) {
      dev_->DestroyEvent(e);
      return r;
    }
    RetireBehind(e, {s.ptr}, {});
    s = CommSet::ScratchBuf{};
  }
  const uint64_t want = std::max<uint64_t>(bytes, 1 << 20);
  ASSIGN_OR_RETURN(s.ptr, dev_->Allocate(device, want));
  s.bytes = want;
  return s.ptr;
}

absl::StatusOr<std::shared_ptr<NcclEngine::CommSet>> NcclEngine::CommsFor(const EngineTask& t) {
  // This node's members: their NCCL ranks are their member indices in a
  // communicator of all members (other daemons own the others).
  std::vector<int> ranks, devices, nccl_ranks, comm_of(t.members.size(), -1);
  std::vector<int> comm_devices;  // the device of each communicator
  std::set<int> nodes;
  for (size_t i = 0; i < t.members.size(); ++i) {
    const EngineMember& m = t.members[i];
    nodes.insert(m.node);
    if (!m.local) continue;
    ranks.push_back(m.global_rank);
    devices.push_back(m.send.device);
  }
  const bool all_local = ranks.size() == t.members.size();
  if (all_local) {
    // One NCCL rank per device, in order of first appearance; members that
    // share a device share its communicator (and its intra-device plan).
    SharedDevicePlan::Ranks assigned = SharedDevicePlan::AssignRanks(devices);
    comm_of = std::move(assigned.comm_of);
    comm_devices = std::move(assigned.devices);
    for (size_t c = 0; c < comm_devices.size(); ++c) nccl_ranks.push_back(static_cast<int>(c));
  } else {
    for (size_t i = 0; i < t.members.size(); ++i) {
      if (!t.members[i].local) continue;
      comm_of[i] = static_cast<int>(comm_devices.size());
      comm_devices.push_back(t.members[i].send.device);
      nccl_ranks.push_back(static_cast<int>(i));
    }
  }
  const bool shared = comm_devices.size() < ranks.size();
  const int nccl_size = all_local ? static_cast<int>(comm_devices.size())
                                  : static_cast<int>(t.members.size());
  const std::string key = absl::StrCat(t.group_key, "#", t.epoch, "#", absl::StrJoin(ranks, ","),
                                       all_local ? "" : absl::StrCat("/", t.members.size()));
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
  set->comm_of = comm_of;
  set->shared = shared;
  // Survivors of a healthy older epoch: shrink it (cheaper than a new init).
  std::shared_ptr<CommSet> old;
  for (auto& [k, s] : sets_) {
    if (s->group_key == t.group_key && s->epoch < t.epoch && s->broken.ok() &&
        s->running.empty() && !s->comms.empty()) {
      old = s;
    }
  }
  bool shrunk = false;
  if (all_local && !shared && old != nullptr && !old->shared && coll_->SupportsShrink() &&
      old->ranks.size() > ranks.size() && old->comm_of.size() == old->ranks.size()) {
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
  if (shared && comm_devices.size() == 1) {
    // Every member on one GPU: hsdpd's kernels do it all, no communicator.
  } else if (!shrunk) {
    UniqueId id;
    const bool creator = t.members[0].local;
    if (creator) {
      ASSIGN_OR_RETURN(id, coll_->NewUniqueId());
    }
    if (!all_local) {
      // Every daemon hosting members agrees on the id of this epoch's
      // communicator; the first member's daemon creates it.
      if (options_.exchange_id == nullptr) {
        return absl::UnimplementedError("no unique-id exchange between daemons");
      }
      ASSIGN_OR_RETURN(id, options_.exchange_id(absl::StrCat(t.group_key, "#", t.epoch), creator,
                                                id, static_cast<int>(nodes.size()),
                                                absl::Now() + options_.init_timeout));
    }
    ASSIGN_OR_RETURN(set->comms, coll_->InitRanks(id, nccl_size, nccl_ranks, comm_devices));
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
  if (!set->comms.empty()) {
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
  run->deadline = q.deadline;
  absl::Status s = IssueOrError(q, *run);
  run->task = std::move(q.task);
  run->cb = std::move(q.cb);
  if (!s.ok()) {
    for (auto& [d, e] : run->done) dev_->DestroyEvent(e);
    run->done.clear();
    // Work this task did enqueue before the error (a cast-in, a reduce
    // kernel) may still run: it completes once its streams passed a marker.
    for (auto& [d, stream] : run->streams) {
      absl::StatusOr<device::EventHandle> marker = dev_->CreateEvent(d, false);
      if (!marker.ok()) continue;
      if (dev_->RecordEvent(*marker, stream).ok()) {
        run->done[d] = *marker;
      } else {
        dev_->DestroyEvent(*marker);
      }
    }
    run->cb.launched(run->ticket);
    Drain(std::move(run), s);
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
  const bool high = HighPriority(t);
  // A group's tasks run in launch order: on the same stream that is stream
  // order; on another stream (the other priority, or a stream that replaced
  // one after a failure) the device waits for the previous task.
  const Running* prev = nullptr;
  if (run.set != nullptr && run.set->last_ticket != 0) {
    if (auto it = running_.find(run.set->last_ticket); it != running_.end()) prev = it->second.get();
  }
  std::vector<device::StreamHandle> streams(n);
  // Members on other nodes: their daemons issue their calls.
  auto here = [&](int r) { return t.members[r].local; };
  auto comm = [&](int r) { return run.set->comms[run.set->comm_of[r]]; };
  for (int r = 0; r < n; ++r) {
    const EngineMember& m = t.members[r];
    if (!here(r)) continue;
    if (m.send.kind != MemoryKind::kDevice || m.send.device < 0) continue;  // barrier
    if (run.set == nullptr) continue;  // a barrier before any communicator: nothing to order
    const int d = m.send.device;
    ASSIGN_OR_RETURN(streams[r], Stream(*run.set, d, high));
    if (!run.streams.emplace(d, streams[r]).second) continue;  // device already ordered
    if (prev != nullptr) {
      auto ps = prev->streams.find(d);
      auto pe = prev->done.find(d);
      if (ps != prev->streams.end() && ps->second != streams[r] && pe != prev->done.end()) {
        dep_events[d].push_back(pe->second);
      }
    }
    // The producer event completed before the task left the gate
    // (producer_gate.h); no stream waits on it: a wait would capture the
    // trainer's next record of the event if it came meanwhile.
    for (device::EventHandle e : dep_events[d]) RETURN_IF_ERROR(dev_->StreamWaitEvent(streams[r], e));
  }
  const DataType dt = t.spec.dtype;
  const size_t es = DataTypeSize(dt);
  if (run.set != nullptr && run.set->shared) {
    // Several members on one GPU: hsdpd's own kernels within each device,
    // NCCL with one rank per device between them (nccl_engine_shared.cc).
    RETURN_IF_ERROR(IssueShared(t, run, streams));
  } else if (t.collective != Collective::kBarrier &&
             (t.count > 0 || t.collective == Collective::kAllToAll)) {
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
      if (!here(r)) continue;
      const EngineMember& m = t.members[r];
      const auto send = reinterpret_cast<device::DevicePtr>(m.send.data);
      const auto recv = reinterpret_cast<device::DevicePtr>(m.recv.data);
      cin[r] = send;
      cout[r] = recv;
      if (!plan.cast) continue;
      ASSIGN_OR_RETURN(cin[r], Scratch(*run.set, streams[r], m.send.device, 0, in_count * ws));
      cout[r] = cin[r];
      if (rs) {
        ASSIGN_OR_RETURN(cout[r], Scratch(*run.set, streams[r], m.send.device, 1, t.count * ws));
      }
      RETURN_IF_ERROR(dev_->ScaleCastAsync(send, dt, cin[r], plan.wire, in_count, plan.in_scale,
                                           streams[r]));
    }
    std::vector<RedOp> ops(n, RedOp{plan.op, -1});
    if (plan.op == ReduceOp::kPremulSum) {
      for (int r = 0; r < n; ++r) {
        if (!here(r)) continue;
        ASSIGN_OR_RETURN(ops[r], coll_->CreatePreMulSum(plan.premul, plan.wire, comm(r)));
      }
    }
    absl::Status issued = coll_->GroupStart();
    for (int r = 0; r < n && issued.ok(); ++r) {
      if (!here(r)) continue;
      const EngineMember& m = t.members[r];
      const CommHandle c = comm(r);
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
      for (int r = 0; r < n; ++r) {
        if (here(r)) coll_->DestroyRedOp(ops[r], comm(r));
      }
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
      if (!here(r)) continue;
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
    if (!here(r)) continue;
    const EngineMember& m = t.members[r];
    const int d = m.send.kind == MemoryKind::kDevice ? m.send.device : -1;
    if (d < 0) continue;
    if (streams[r] == 0) {
      if (run.set == nullptr) continue;  // a barrier before any communicator: nothing to order
      ASSIGN_OR_RETURN(streams[r], Stream(*run.set, d, high));
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

}  // namespace hsdp::nccl
