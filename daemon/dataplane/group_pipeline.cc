// Group pipelining: a matched operation lowered to an engine task (Lower) and
// launched in sequence order, the next one as soon as the engine has launched
// (ordered) the previous one, not when it finished (Pump, OnLaunched);
// completions reported to every local member and the observer (OnCompleted,
// Notify); the second phase of a composite reduce-scatter + all-reduce handed
// to the replicate group once the first phase is launched (ForwardPhase2). The
// rest of Group: group.h lists its files (same class, same locking rules).
#include <algorithm>
#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/dataplane/group.h"
#include "daemon/dataplane/op_observer.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

// Within a job, a queueing engine runs a lower priority first: marked
// latency-critical ops, then all-gathers and reduce-scatters (they gate
// compute), then the rest.
constexpr int kLatencyCriticalPriority = -1;

int PriorityOf(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter ||
                 c == Collective::kReduceScatterAllReduce
             ? 0
             : 1;
}

}  // namespace

EngineTask Group::Lower(const PendingOp& op) const {
  const Arrival& ref = op.arrivals.begin()->second;
  const shm::OpDescriptor& d = ref.desc;
  EngineTask t;
  t.collective = static_cast<Collective>(d.collective);
  t.count = d.count;
  t.root = d.root;
  t.group_key = spec_.key;
  t.epoch = op.epoch;
  t.seq = op.seq;
  t.spec.dtype = static_cast<DataType>(d.dtype);
  t.spec.op = static_cast<ReduceOp>(d.reduce_op);
  t.spec.wire_dtype = static_cast<DataType>(d.reduce_dtype);
  t.spec.premul_factor = d.premul_factor;
  t.spec.pre_divide = d.pre_divide;
  t.spec.post_divide = d.post_divide;
  if (t.collective == Collective::kReduceScatterAllReduce) {
    const bool sum_like = t.spec.op == ReduceOp::kSum || t.spec.op == ReduceOp::kAvg ||
                          t.spec.op == ReduceOp::kPremulSum;
    if (!ref.phase2) {
      // Phase 1: reduce-scatter with the input-side factors only.
      t.collective = Collective::kReduceScatter;
      if (t.spec.op == ReduceOp::kAvg) t.spec.op = ReduceOp::kSum;
      t.spec.post_divide = 1.0;
    } else {
      // Phase 2: all-reduce of the shard with the output-side factors; AVG
      // divides by the whole mesh (shard size x replicate size) once.
      t.collective = Collective::kAllReduce;
      if (sum_like) {
        if (t.spec.op == ReduceOp::kAvg) t.spec.post_divide *= double(ref.shard_size) * size();
        t.spec.op = ReduceOp::kSum;
      }
      t.spec.premul_factor = 1.0;
      t.spec.pre_divide = 1.0;
    }
  }
  const shm::OpExtents ext =
      shm::ComputeOpExtents(t.collective, t.count, DataTypeSize(t.spec.dtype), size());
  t.members.resize(size());
  for (int r = 0; r < size(); ++r) {
    EngineMember& m = t.members[r];
    m.global_rank = spec_.ranks[r];
    m.node = spec_.nodes.empty() ? spec_.this_node : spec_.nodes[r];
    m.local = IsLocal(r);
    if (!m.local) continue;
    const Arrival& a = op.arrivals.at(local_index_[r]);
    // An uneven all-to-all has count 0: its splits give the extents (as
    // validate.cc checked them), which the cross-node engine checks its
    // buffers against.
    const bool splits = !a.send_counts.empty();
    const uint64_t send_bytes = splits ? a.splits_send_bytes : ext.send_bytes;
    const uint64_t recv_bytes = splits ? a.splits_recv_bytes : ext.recv_bytes;
    m.send = BufferView{a.kind, a.device, const_cast<void*>(a.send), send_bytes};
    m.recv = BufferView{a.kind, a.device, a.recv, recv_bytes};
    if (a.kind == MemoryKind::kDevice) {
      // Phase 2 of a composite waits on phase 1 (depends_on), not on the
      // producer again; phase 1 records no completion (phase 2 reports).
      const bool first_phase =
          static_cast<Collective>(d.collective) == Collective::kReduceScatterAllReduce &&
          !ref.phase2;
      m.wait_event = a.phase2 ? 0 : a.wait_event;
      m.done_event = first_phase ? 0 : a.done_event;
    }
    m.send_counts = a.send_counts;
    m.recv_counts = a.recv_counts;
    for (uint64_t dep : a.depends_on) {
      if (std::find(t.depends_on.begin(), t.depends_on.end(), dep) == t.depends_on.end()) {
        t.depends_on.push_back(dep);
      }
    }
  }
  // Latency-critical when any member says so (shm::kFlagLatencyCritical):
  // ahead of the job's other work in a queueing engine.
  const bool critical = std::any_of(op.arrivals.begin(), op.arrivals.end(), [](const auto& a) {
    return (a.second.desc.flags & shm::kFlagLatencyCritical) != 0;
  });
  t.priority = critical ? kLatencyCriticalPriority : PriorityOf(t.collective);
  t.job = job_encoded_;
  t.qos_class = static_cast<int>(spec_.qos_class);
  return t;
}

void Group::Pump() {
  std::vector<std::pair<Arrival, absl::Status>> failed;
  std::vector<uint64_t> aborts;
  {
    absl::MutexLock l(&mu_);
    failed.swap(deferred_failures_);
    aborts.swap(deferred_aborts_);
  }
  for (uint64_t t : aborts) engine_->Abort(t, absl::AbortedError("the epoch ended"));
  for (auto& [arrival, status] : failed) {
    std::vector<Arrival> one;
    one.push_back(std::move(arrival));
    Notify(std::move(one), status, 0, 0);
  }
  for (;;) {
    auto run = std::make_shared<RunningOp>();
    {
      absl::MutexLock l(&mu_);
      matcher_.SkipFailed();
      if (awaiting_launch_ || !epoch_failure_.ok()) return;
      std::optional<PendingOp> ready = matcher_.TakeReady();
      if (!ready.has_value()) return;
      run->op = std::move(*ready);
      ++ops_started_;
      awaiting_launch_ = true;
      run->start_ns = shm::NowNanos();
      running_.push_back(run);
    }
    EngineTask task = Lower(run->op);
    // 0: Launch has not returned; 1: launched before Launch returned (this
    // loop goes on); 2: Launch returned first (the callback pumps).
    auto phase = std::make_shared<std::atomic<int>>(0);
    EngineCallbacks cb;
    cb.launched = [self = shared_from_this(), run, phase](uint64_t ticket) {
      self->OnLaunched(run, ticket);
      int expected = 0;
      if (!phase->compare_exchange_strong(expected, 1)) self->Pump();
    };
    cb.completed = [self = shared_from_this(), run](absl::Status s, uint64_t exec_ns) {
      self->OnCompleted(run, std::move(s), exec_ns);
    };
    const uint64_t ticket = engine_->Launch(std::move(task), std::move(cb));
    {
      absl::MutexLock l(&mu_);
      if (run->ticket == 0) run->ticket = ticket;
    }
    int expected = 0;
    if (phase->compare_exchange_strong(expected, 2)) return;
  }
}

void Group::OnLaunched(const std::shared_ptr<RunningOp>& run, uint64_t ticket) {
  std::vector<Arrival> forward;
  {
    absl::MutexLock l(&mu_);
    awaiting_launch_ = false;
    run->ticket = ticket;
    const Arrival& a = run->op.arrivals.begin()->second;
    if (spec_.observer != nullptr) spec_.observer->OnLaunched(spec_, a, ticket);
    if (static_cast<Collective>(a.desc.collective) == Collective::kReduceScatterAllReduce &&
        !a.phase2 && !run->finished.load()) {
      run->forwarded = true;
      for (auto& [li, arr] : run->op.arrivals) forward.push_back(arr);  // phase 1 keeps its own
    }
  }
  // The second phase may start as soon as the engine ordered the first.
  if (!forward.empty()) ForwardPhase2(std::move(forward), absl::OkStatus(), ticket);
}

void Group::OnCompleted(const std::shared_ptr<RunningOp>& run, absl::Status status,
                        uint64_t exec_ns) {
  bool forwarded;
  {
    absl::MutexLock l(&mu_);
    running_.erase(std::remove(running_.begin(), running_.end(), run), running_.end());
    if (run->finished.exchange(true)) return;  // already failed at its deadline
    forwarded = run->forwarded;
    if (!status.ok()) ++ops_failed_;
    if (status.ok() && run->op.epoch == epoch_) {
      completed_seq_ = std::max(completed_seq_, run->op.seq);
    }
  }
  if (!status.ok() && spans_nodes()) {
    // A failed cross-node operation leaves the daemons out of step (and the
    // engine's link of this epoch broken): the epoch ends everywhere.
    // Peers hear only the cause (they name the operation themselves).
    FailEpoch(absl::Status(status.code(), absl::StrCat(Describe(run->op), ": ", status.message())),
              run->op.epoch, /*report=*/true, &status);
  }
  PendingOp& op = run->op;
  std::vector<Arrival> arrivals;
  for (auto& [li, a] : op.arrivals) arrivals.push_back(std::move(a));
  const auto c = static_cast<Collective>(arrivals[0].desc.collective);
  if (c == Collective::kReduceScatterAllReduce && !arrivals[0].phase2) {
    if (spec_.observer != nullptr) {
      spec_.observer->OnCompleted(
          spec_, arrivals, status,
          static_cast<uint64_t>(std::max<int64_t>(0, run->start_ns - op.first_ns)), exec_ns);
    }
    // The second phase reports (it depends on this one and fails with it).
    if (!forwarded) ForwardPhase2(std::move(arrivals), status, 0);
    return;
  }
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(Describe(op), ": ", status.message()));
  }
  const uint64_t queued = static_cast<uint64_t>(std::max<int64_t>(0, run->start_ns - op.first_ns));
  Notify(std::move(arrivals), status, queued, exec_ns);
}

void Group::ForwardPhase2(std::vector<Arrival> arrivals, const absl::Status& status,
                          uint64_t depends_on) {
  for (Arrival& a : arrivals) {
    std::shared_ptr<Group> g2 = lookup_(a.desc.group2_id);
    const int r2 = g2 != nullptr ? g2->RankOf(a.session->info().rank) : -1;
    if (g2 == nullptr || r2 < 0) {
      a.session->Complete(a.desc.op_id,
                          absl::FailedPreconditionError(absl::StrCat("group2_id: replicate group ",
                                                                     a.desc.group2_id, " is gone")),
                          0, 0);
      continue;
    }
    Arrival next;
    next.session = a.session;
    next.desc = a.desc;
    next.epoch = a.desc.epoch2;
    next.seq = a.desc.seq2;
    next.phase2 = true;
    next.shard_size = size();
    next.send = a.recv;
    next.recv = a.recv;
    next.recv_buf = a.recv_buf;
    next.kind = a.kind;
    next.device = a.device;
    next.recv_keep = a.recv_keep;
    next.done_event = a.done_event;
    next.completion_event_id = a.completion_event_id;
    next.first_ns = a.first_ns;
    if (depends_on != 0) next.depends_on.push_back(depends_on);
    if (!status.ok()) {
      next.rejected = absl::Status(status.code(),
                                   absl::StrCat("reduce-scatter phase failed: ", status.message()));
    }
    g2->Arrive(r2, std::move(next));
  }
}

void Group::Notify(std::vector<Arrival> arrivals, const absl::Status& status, uint64_t queued_ns,
                   uint64_t exec_ns) {
  // Every member gets the status; the log gets a sample (a client can cause
  // failures at will, so they must not be able to flood it).
  if (!status.ok()) HSDP_LOG_EVERY_N_SEC(Warning, 1) << status.message();
  // Failures before the loop (it may move arrivals on); successes after it,
  // off the members' latency.
  if (spec_.observer != nullptr && !status.ok()) {
    spec_.observer->OnCompleted(spec_, arrivals, status, queued_ns, exec_ns);
  }
  for (Arrival& a : arrivals) {
    const auto c = static_cast<Collective>(a.desc.collective);
    if (!status.ok() && c == Collective::kReduceScatterAllReduce && !a.phase2 && a.rejected.ok()) {
      // A failed first phase still has to release the member's second-phase
      // slot in its replicate group.
      ForwardPhase2({std::move(a)}, status, 0);
      continue;
    }
    a.session->Complete(a.desc.op_id, status, queued_ns, exec_ns, -1,
                        status.ok() ? a.completion_event_id : 0);
  }
  if (spec_.observer != nullptr && status.ok()) {
    spec_.observer->OnCompleted(spec_, arrivals, status, queued_ns, exec_ns);
  }
}

}  // namespace hsdp
