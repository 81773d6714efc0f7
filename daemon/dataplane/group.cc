#include "daemon/dataplane/group.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/strings/str_join.h"
#include "daemon/dataplane/op_observer.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

constexpr size_t kMaxRememberedFailures = 4096;
constexpr size_t kMaxListedRanks = 16;

bool SameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

int PriorityOf(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter ||
                 c == Collective::kReduceScatterAllReduce
             ? 0
             : 1;
}

// "[0, 1, 2]", or the first kMaxListedRanks and a count of the rest, so a
// huge group cannot flood logs and completion messages.
std::string ListRanks(const std::vector<int>& ranks) {
  if (ranks.size() <= kMaxListedRanks) return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
  std::vector<int> head(ranks.begin(), ranks.begin() + kMaxListedRanks);
  return absl::StrCat("[", absl::StrJoin(head, ", "), ", ... (", ranks.size() - kMaxListedRanks,
                      " more)]");
}

}  // namespace

std::string GroupKey(const JobKey& job, const std::vector<int>& ranks, int k) {
  // Unambiguous: the owner, a length-prefixed job id, then numbers.
  return absl::StrCat(job.Encoded(), "/", absl::StrJoin(ranks, ","), "#", k);
}

Group::Group(GroupSpec spec, Engine* engine, GroupLookup lookup)
    : spec_(std::move(spec)), engine_(engine), lookup_(std::move(lookup)) {
  const int n = size();
  local_index_.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    const bool local = spec_.nodes.empty() || spec_.nodes[r] == spec_.this_node;
    if (local) {
      local_index_[r] = static_cast<int>(local_ranks_.size());
      local_ranks_.push_back(r);
    }
  }
  members_.resize(n);
  epoch_ = std::max<uint32_t>(1, spec_.first_epoch);
  joined_epoch_.assign(n, epoch_);
  waits_.resize(n);
}

int Group::RankOf(int global_rank) const {
  for (size_t i = 0; i < spec_.ranks.size(); ++i) {
    if (spec_.ranks[i] == global_rank) return static_cast<int>(i);
  }
  return -1;
}

bool Group::IsLocal(int group_rank) const {
  return group_rank >= 0 && group_rank < size() && local_index_[group_rank] >= 0;
}

uint32_t Group::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

absl::StatusOr<uint32_t> Group::Join(int group_rank, std::shared_ptr<Session> session) {
  uint32_t result;
  {
    absl::MutexLock l(&mu_);
    if (!IsLocal(group_rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group rank ", group_rank, " is not a member of group ", spec_.id, " on this node"));
    }
    std::shared_ptr<Session>& slot = members_[group_rank];
    if (slot != nullptr && slot.get() != session.get() && !slot->closed()) {
      return absl::AlreadyExistsError(absl::StrCat("group ", spec_.id, ": rank ",
                                                   spec_.ranks[group_rank],
                                                   " already joined by session ", slot->id()));
    }
    slot = std::move(session);
    if (epoch_failure_.ok()) {
      joined_epoch_[group_rank] = epoch_;
      return epoch_;
    }
    result = epoch_ + 1;
    joined_epoch_[group_rank] = result;
    MaybeAdvanceLocked();
  }
  Pump();  // submissions for the new epoch may already be queued
  return result;
}

void Group::RemoteJoined(int group_rank, uint32_t epoch) {
  {
    absl::MutexLock l(&mu_);
    if (group_rank < 0 || group_rank >= size() || IsLocal(group_rank)) return;
    joined_epoch_[group_rank] = std::max(joined_epoch_[group_rank], epoch);
    MaybeAdvanceLocked();
  }
  Pump();
}

void Group::PeerJoined(int node) {
  {
    absl::MutexLock l(&mu_);
    for (int r = 0; r < size(); ++r) {
      if (!IsLocal(r) && !spec_.nodes.empty() && spec_.nodes[r] == node &&
          joined_epoch_[r] == 0) {
        joined_epoch_[r] = epoch_ + 1;
      }
    }
    MaybeAdvanceLocked();
  }
  Pump();
}

void Group::RemoteEpochFailed(uint32_t epoch, const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (epoch < epoch_ || (epoch == epoch_ && !epoch_failure_.ok())) return;  // over already
    if (epoch > epoch_) {
      // Not reached yet (this daemon still waits for members to re-join):
      // fail it on arrival. Bounded: only epochs ahead of the current one.
      if (remote_failed_.size() < 64) remote_failed_.emplace(epoch, why);
      return;
    }
  }
  FailEpoch(why, epoch, /*report=*/false);
}

void Group::MaybeAdvanceLocked() {
  if (epoch_failure_.ok()) return;
  for (int r = 0; r < size(); ++r) {
    if (IsLocal(r)) {
      if (joined_epoch_[r] != epoch_ + 1) return;
      if (members_[r] == nullptr || members_[r]->closed()) return;
    } else if (joined_epoch_[r] == 0) {
      return;  // on a lost node: waits for it to join again
    }
  }
  ++epoch_;
  epoch_failure_ = absl::OkStatus();
  failed_.clear();
  p2p_posted_.clear();
  next_run_ = 1;
  for (auto it = remote_failed_.begin(); it != remote_failed_.end() && it->first < epoch_;) {
    it = remote_failed_.erase(it);
  }
  if (auto it = remote_failed_.find(epoch_); it != remote_failed_.end()) {
    epoch_failure_ = it->second;  // another daemon already failed this epoch
    remote_failed_.erase(it);
  }
  EngineGroupSpec es{spec_.key, epoch_, spec_.ranks, spec_.nodes, spec_.this_node};
  if (es.nodes.empty()) es.nodes.assign(spec_.ranks.size(), spec_.this_node);
  if (absl::Status s = engine_->CreateGroup(es); !s.ok()) {
    epoch_failure_ = s;  // the engine cannot run the new epoch: it stays failed
  }
  HSDP_LOG(Info) << "group " << spec_.id << " (job \"" << spec_.job_id << "\") re-formed in epoch "
                 << epoch_;
}

bool Group::IsMember(int group_rank, const Session* session) const {
  absl::MutexLock l(&mu_);
  return IsLocal(group_rank) && members_[group_rank].get() == session;
}

std::string Group::RanksList(const std::vector<int>& group_ranks) const {
  std::vector<int> global;
  for (int r : group_ranks) global.push_back(spec_.ranks[r]);
  return ListRanks(global);
}

const Arrival& Group::AnyArrival(const PendingOp& op) const {
  if (!op.arrivals.empty()) return op.arrivals.begin()->second;
  static const Arrival kNone;
  return kNone;
}

std::string Group::Describe(const PendingOp& op) const {
  const Arrival& a = AnyArrival(op);
  const auto c = static_cast<Collective>(a.desc.collective);
  return absl::StrCat(std::string(CollectiveName(c)), a.phase2 ? " (all-reduce phase)" : "",
                      " seq ", op.seq, op.epoch > 1 ? absl::StrCat(" epoch ", op.epoch) : "",
                      " in group ", spec_.id, " (job \"", spec_.job_id, "\", ",
                      // Short, so what follows (who is missing) fits a completion record.
                      size() <= 8 ? absl::StrCat("ranks ", ListRanks(spec_.ranks))
                                  : absl::StrCat(size(), " ranks"),
                      ")");
}

std::string Group::Disagreement(const PendingOp& op) const {
  const Arrival& ref = op.arrivals.begin()->second;
  const int ref_rank = spec_.ranks[local_ranks_[op.arrivals.begin()->first]];
  std::vector<std::string> problems;
  auto check = [&](const char* field, auto get, auto show) {
    for (const auto& [li, a] : op.arrivals) {
      if (!(get(a) == get(ref))) {
        problems.push_back(absl::StrCat(field, ": rank ", ref_rank, " has ", show(ref), ", rank ",
                                        spec_.ranks[local_ranks_[li]], " has ", show(a)));
        return;
      }
    }
  };
  auto op_name = [](const Arrival& a) {
    return std::string(CollectiveName(static_cast<Collective>(a.desc.collective)));
  };
  check("collective", [](const Arrival& a) { return a.desc.collective; }, op_name);
  check("count", [](const Arrival& a) { return a.desc.count; },
        [](const Arrival& a) { return absl::StrCat(a.desc.count); });
  check("dtype", [](const Arrival& a) { return a.desc.dtype; },
        [](const Arrival& a) { return std::string(DataTypeName(static_cast<DataType>(a.desc.dtype))); });
  // One engine runs an operation: every member's buffers are host memory, or
  // every member's are device memory.
  check("memory", [](const Arrival& a) { return a.kind; },
        [](const Arrival& a) {
          return std::string(a.kind == MemoryKind::kDevice ? "device buffers" : "host buffers");
        });
  const Collective c = static_cast<Collective>(ref.desc.collective);
  if (shm::IsReducing(c)) {
    check("reduce_op", [](const Arrival& a) { return a.desc.reduce_op; },
          [](const Arrival& a) { return std::string(ReduceOpName(static_cast<ReduceOp>(a.desc.reduce_op))); });
    check("reduce_dtype", [](const Arrival& a) { return a.desc.reduce_dtype; },
          [](const Arrival& a) {
            return a.desc.reduce_dtype == 0
                       ? std::string("(buffer dtype)")
                       : std::string(DataTypeName(static_cast<DataType>(a.desc.reduce_dtype)));
          });
    for (auto [field, member] : {std::pair{"premul_factor", &shm::OpDescriptor::premul_factor},
                                 std::pair{"pre_divide", &shm::OpDescriptor::pre_divide},
                                 std::pair{"post_divide", &shm::OpDescriptor::post_divide}}) {
      for (const auto& [li, a] : op.arrivals) {
        if (!SameDouble(a.desc.*member, ref.desc.*member)) {
          problems.push_back(absl::StrCat(field, ": rank ", ref_rank, " has ", ref.desc.*member,
                                          ", rank ", spec_.ranks[local_ranks_[li]], " has ",
                                          a.desc.*member));
          break;
        }
      }
    }
  }
  if (c == Collective::kBroadcast) {
    check("root", [](const Arrival& a) { return a.desc.root; },
          [](const Arrival& a) { return absl::StrCat(a.desc.root); });
  }
  if (c == Collective::kAllToAll) {
    check("splits", [](const Arrival& a) { return a.send_counts.empty(); },
          [](const Arrival& a) { return a.send_counts.empty() ? "equal blocks" : "splits"; });
    // What i sends to j must be what j expects from i (local pairs; remote
    // members are checked by their own daemons).
    if (problems.empty() && !ref.send_counts.empty()) {
      for (const auto& [li, a] : op.arrivals) {
        const int i = local_ranks_[li];
        for (const auto& [lj, b] : op.arrivals) {
          const int j = local_ranks_[lj];
          if (a.send_counts[j] != b.recv_counts[i]) {
            problems.push_back(absl::StrCat("splits: rank ", spec_.ranks[i], " sends ",
                                            a.send_counts[j], " elements to rank ",
                                            spec_.ranks[j], ", which expects ",
                                            b.recv_counts[i]));
            break;
          }
        }
        if (!problems.empty()) break;
      }
    }
  }
  if (ref.phase2) {
    check("shard group size", [](const Arrival& a) { return a.shard_size; },
          [](const Arrival& a) { return absl::StrCat(a.shard_size); });
  }
  if (problems.empty()) return "";
  return absl::StrCat("members disagree: ", absl::StrJoin(problems, "; "));
}

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
  t.priority = PriorityOf(t.collective);
  return t;
}

void Group::Arrive(int group_rank, Arrival arrival) {
  const auto kind = static_cast<Collective>(arrival.desc.collective);
  if (kind == Collective::kSend || kind == Collective::kRecv) {
    return ArriveP2P(group_rank, std::move(arrival));
  }
  std::vector<Arrival> to_fail;
  absl::Status fail_status;
  {
    absl::MutexLock l(&mu_);
    const uint64_t seq = arrival.seq;
    const uint32_t epoch = arrival.epoch;
    arrival.arrived_ns = shm::NowNanos();
    if (spec_.observer != nullptr) spec_.observer->OnArrival(spec_, arrival);
    auto reject_one = [&](absl::Status s) {
      to_fail.push_back(std::move(arrival));
      fail_status = std::move(s);
    };
    const bool local = IsLocal(group_rank);
    const bool next_epoch_queue = local && !epoch_failure_.ok() && epoch == epoch_ + 1 &&
                                  joined_epoch_[group_rank] == epoch_ + 1;
    const bool runnable_slot = epoch == epoch_ && epoch_failure_.ok() && seq >= next_run_ &&
                               seq <= next_run_ + spec_.max_pending;
    if (!local) {
      reject_one(absl::InvalidArgumentError(absl::StrCat("group_id: group rank ", group_rank,
                                                         " is not on this node")));
    } else if (!arrival.rejected.ok() && !runnable_slot) {
      // Invalid, and not naming an operation it could fail for the others.
      reject_one(arrival.rejected);
    } else if (epoch < epoch_ || (epoch == epoch_ && !epoch_failure_.ok())) {
      reject_one(epoch == epoch_
                     ? epoch_failure_
                     : absl::FailedPreconditionError(absl::StrCat(
                           "epoch: epoch ", epoch, " of group ", spec_.id, " is over (now ",
                           epoch_, "); join the group again for the current epoch")));
    } else if (epoch != epoch_ && !next_epoch_queue) {
      reject_one(absl::InvalidArgumentError(absl::StrCat(
          "epoch: ", epoch, " is not an epoch group ", spec_.id, " can run (current ", epoch_,
          epoch_failure_.ok() ? ")" : ", failed; join the group again first)")));
    } else if (epoch == epoch_ && failed_.count(seq) > 0) {
      reject_one(failed_.at(seq));
    } else if (seq == 0 || (epoch == epoch_ && seq < next_run_)) {
      reject_one(absl::InvalidArgumentError(absl::StrCat(
          "seq: ", seq, " in group ", spec_.id, " already ran (next is ", next_run_, ")")));
    } else if (seq > (epoch == epoch_ ? next_run_ : 1) + spec_.max_pending) {
      reject_one(absl::InvalidArgumentError(absl::StrCat(
          "seq: ", seq, " in group ", spec_.id, " is more than ", spec_.max_pending,
          " operations ahead of the next one to run")));
    } else if (pending_.count({epoch, seq}) == 0 && pending_.size() >= spec_.max_pending) {
      reject_one(absl::ResourceExhaustedError(
          absl::StrCat("group ", spec_.id, " already has ", pending_.size(),
                       " operations waiting for members (limits.max_pending_ops)")));
    } else {
      PendingOp& op = pending_[{epoch, seq}];
      if (op.seq == 0) {
        op.epoch = epoch;
        op.seq = seq;
        op.first_ns = arrival.first_ns;
      }
      const int li = local_index_[group_rank];
      if (op.arrivals.count(li) > 0) {
        reject_one(absl::InvalidArgumentError(absl::StrCat("seq: rank ", spec_.ranks[group_rank],
                                                           " submitted seq ", seq, " of group ",
                                                           spec_.id, " twice")));
      } else if (!arrival.rejected.ok()) {
        // An invalid submission fails the operation for every member.
        const absl::Status rejected = arrival.rejected;
        const bool first_phase_failed = arrival.phase2;  // its only way to be rejected
        op.arrivals[li] = std::move(arrival);  // so Describe names its collective
        const absl::Status s =
            first_phase_failed
                ? rejected
                : absl::Status(rejected.code(),
                               absl::StrCat(Describe(op), ": rank ", spec_.ranks[group_rank],
                                            "'s submission was rejected: ", rejected.message()));
        to_fail = FailLocked({epoch, seq}, s);
        fail_status = s;
      } else {
        op.first_ns = std::min(op.first_ns, arrival.first_ns);
        op.arrivals[li] = std::move(arrival);
        if (++op.arrived == static_cast<int>(local_ranks_.size())) {
          if (std::string why = Disagreement(op); !why.empty()) {
            fail_status = absl::InvalidArgumentError(absl::StrCat(Describe(op), ": ", why));
            to_fail = FailLocked({epoch, seq}, fail_status);
          } else {
            RecordWaitsLocked(op);
            if (spec_.observer != nullptr) spec_.observer->OnMatched(spec_, op.arrivals);
          }
        }
      }
    }
  }
  if (!to_fail.empty()) {
    Notify(std::move(to_fail), fail_status, 0, 0);
    return;
  }
  Pump();
}

void Group::RecordWaitsLocked(const PendingOp& op) {
  if (op.arrivals.size() < 2) return;
  int last = -1;
  int64_t last_ns = INT64_MIN, second_ns = INT64_MIN;
  for (const auto& [li, a] : op.arrivals) {
    const int64_t t = a.arrived_ns;
    if (t > last_ns) {
      second_ns = last_ns;
      last_ns = t;
      last = li;
    } else if (t > second_ns) {
      second_ns = t;
    }
  }
  RankWait& w = waits_[local_ranks_[last]];
  ++w.times_last;
  w.waited_ns += static_cast<uint64_t>(last_ns - second_ns);
}

std::vector<Arrival> Group::FailLocked(OpKey key, const absl::Status& status) {
  std::vector<Arrival> out;
  auto it = pending_.find(key);
  if (it != pending_.end()) {
    for (auto& [li, a] : it->second.arrivals) out.push_back(std::move(a));
    pending_.erase(it);
  }
  if (key.first == epoch_) {
    failed_[key.second] = status;
    while (failed_.size() > kMaxRememberedFailures) failed_.erase(failed_.begin());
  }
  ++ops_failed_;
  return out;
}

bool Group::FailEpochLocked(const absl::Status& status, std::vector<Arrival>* to_fail,
                            std::vector<uint64_t>* to_abort) {
  if (!epoch_failure_.ok()) return false;
  epoch_failure_ = status;
  std::vector<OpKey> keys;
  for (auto& [key, op] : pending_) {
    if (key.first == epoch_) keys.push_back(key);
  }
  for (const OpKey& key : keys) {
    for (Arrival& a : FailLocked(key, status)) to_fail->push_back(std::move(a));
  }
  for (P2POp& p : TakeAllP2PLocked()) to_fail->push_back(std::move(p.arrival));
  for (const std::shared_ptr<RunningOp>& run : running_) {
    if (run->ticket != 0) to_abort->push_back(run->ticket);
  }
  for (const auto& [ticket, epoch] : p2p_running_) {
    if (epoch == epoch_) to_abort->push_back(ticket);
  }
  return true;
}

void Group::FailEpoch(const absl::Status& status, uint32_t epoch, bool report,
                      const absl::Status* cause) {
  std::vector<Arrival> to_fail;
  std::vector<uint64_t> to_abort;
  uint32_t failed_epoch = 0;
  {
    absl::MutexLock l(&mu_);
    if (epoch != 0 && epoch != epoch_) return;  // that epoch is over already
    if (FailEpochLocked(status, &to_fail, &to_abort)) failed_epoch = epoch_;
  }
  if (report && failed_epoch != 0 && spans_nodes() && spec_.on_epoch_failed) {
    spec_.on_epoch_failed(failed_epoch, cause != nullptr ? *cause : status);
  }
  // Running operations end through the engine (aborted where it can), or at
  // their deadline.
  for (uint64_t t : to_abort) engine_->Abort(t, status);
  if (!to_fail.empty()) Notify(std::move(to_fail), status, 0, 0);
}

void Group::Pump() {
  for (;;) {
    auto run = std::make_shared<RunningOp>();
    {
      absl::MutexLock l(&mu_);
      while (failed_.count(next_run_) > 0) ++next_run_;
      auto it = pending_.find({epoch_, next_run_});
      if (awaiting_launch_ || !epoch_failure_.ok() || it == pending_.end() ||
          it->second.arrived < static_cast<int>(local_ranks_.size())) {
        return;
      }
      run->op = std::move(it->second);
      pending_.erase(it);
      ++next_run_;
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
                          absl::FailedPreconditionError(absl::StrCat(
                              "group2_id: replicate group ", a.desc.group2_id, " is gone")),
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
      next.rejected = absl::Status(
          status.code(), absl::StrCat("reduce-scatter phase failed: ", status.message()));
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
    if (!status.ok() && c == Collective::kReduceScatterAllReduce && !a.phase2 &&
        a.rejected.ok()) {
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

void Group::MemberLeft(const Session* session, const std::string& why) {
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    int rank = -1;
    for (int r : local_ranks_) {
      if (members_[r].get() == session) rank = r;
    }
    if (rank < 0) return;
    members_[rank].reset();
    joined_epoch_[rank] = 0;
    status = absl::AbortedError(absl::StrCat(
        "rank ", spec_.ranks[rank], " left the job (", why, "); epoch ", epoch_, " of group ",
        spec_.id, " (job \"", spec_.job_id, "\") ended: join the group again to continue"));
  }
  FailEpoch(status, 0, /*report=*/true);
}

void Group::PeerLost(int node, const std::string& why) {
  std::vector<int> lost;
  for (int r = 0; r < size(); ++r) {
    if (!spec_.nodes.empty() && spec_.nodes[r] == node && !IsLocal(r)) lost.push_back(r);
  }
  if (lost.empty()) return;
  const absl::Status status = absl::AbortedError(
      absl::StrCat("node ", node, " hosting rank(s) ", RanksList(lost), " was lost (", why,
                   "); the epoch of group ", spec_.id, " (job \"", spec_.job_id, "\") ended"));
  {
    absl::MutexLock l(&mu_);
    for (int r : lost) joined_epoch_[r] = 0;
    // Already failed (the engine saw the link break first): later
    // submissions hear the cause instead.
    if (!epoch_failure_.ok()) epoch_failure_ = status;
  }
  // Reported too: the others know already, but the coordinator then records
  // the failed epoch, so a restarted node's new group starts in line.
  FailEpoch(status, 0, /*report=*/true);
}

void Group::CheckTimeouts(int64_t now_ns) {
  std::vector<std::pair<std::vector<Arrival>, absl::Status>> fails;
  std::vector<std::shared_ptr<RunningOp>> overdue;
  std::optional<std::pair<uint32_t, absl::Status>> epoch_missing;
  bool skipped = false;
  {
    absl::MutexLock l(&mu_);
    std::vector<OpKey> expired;
    for (auto& [key, op] : pending_) {
      if (op.arrived < static_cast<int>(local_ranks_.size()) &&
          now_ns - op.first_ns > spec_.timeout_ns) {
        expired.push_back(key);
      }
    }
    for (const OpKey& key : expired) {
      const PendingOp& op = pending_[key];
      std::vector<int> missing, arrived;
      for (int r : local_ranks_) {
        (op.arrivals.count(local_index_[r]) > 0 ? arrived : missing).push_back(r);
      }
      absl::Status s = absl::DeadlineExceededError(absl::StrCat(
          Describe(op), ": timed out after ", spec_.timeout_ns / 1000000,
          " ms waiting for rank(s) ", RanksList(missing), "; arrived: ", RanksList(arrived)));
      // Across nodes the others already run this operation: the epoch ends
      // everywhere (and they hear who was missing).
      if (spans_nodes() && key.first == epoch_ && !epoch_missing.has_value()) {
        epoch_missing.emplace(key.first, s);
      }
      fails.emplace_back(FailLocked(key, s), s);
    }
    for (const std::shared_ptr<RunningOp>& run : running_) {
      if (now_ns - run->start_ns > spec_.timeout_ns && !run->finished.load()) {
        overdue.push_back(run);
      }
    }
    for (auto* queues : {&p2p_sends_, &p2p_recvs_}) {
      const bool sends = queues == &p2p_sends_;
      for (auto& [key, q] : *queues) {
        while (!q.empty() && now_ns - q.front().arrival.first_ns > spec_.timeout_ns) {
          const auto [src, dst, tag] = key;
          const std::string peer = sends ? absl::StrCat("rank ", spec_.ranks[dst])
                                   : src == kAnySource ? std::string("any rank")
                                                       : absl::StrCat("rank ", spec_.ranks[src]);
          absl::Status s = absl::DeadlineExceededError(absl::StrCat(
              sends ? "send to " : "recv from ", peer, " (tag ", tag, ") in group ", spec_.id,
              " (job \"", spec_.job_id, "\"): timed out after ", spec_.timeout_ns / 1000000,
              " ms waiting for the matching ", sends ? "recv" : "send"));
          std::vector<Arrival> one;
          one.push_back(std::move(q.front().arrival));
          q.pop_front();
          --p2p_queued_;
          ++ops_failed_;
          fails.emplace_back(std::move(one), std::move(s));
        }
      }
    }
    // Complete operations queued behind a sequence number nobody submitted
    // (only a misbehaving client can cause this): fail that number so the
    // queue moves on instead of waiting forever.
    if (!awaiting_launch_ && epoch_failure_.ok() && !pending_.empty() &&
        pending_.count({epoch_, next_run_}) == 0 && failed_.count(next_run_) == 0) {
      int64_t oldest = now_ns;
      for (auto& [key, op] : pending_) {
        if (key.first == epoch_) oldest = std::min(oldest, op.first_ns);
      }
      if (now_ns - oldest > spec_.timeout_ns) {
        failed_[next_run_] = absl::DeadlineExceededError(absl::StrCat(
            "seq ", next_run_, " in group ", spec_.id, " was never submitted by any member within ",
            spec_.timeout_ns / 1000000, " ms; later operations were waiting for it"));
        ++ops_failed_;
        skipped = true;
      }
    }
  }
  for (auto& [arrivals, s] : fails) Notify(std::move(arrivals), s, 0, 0);
  if (epoch_missing.has_value()) {
    FailEpoch(epoch_missing->second, epoch_missing->first, /*report=*/true);
  }
  for (const std::shared_ptr<RunningOp>& run : overdue) {
    const absl::Status s = absl::DeadlineExceededError(absl::StrCat(
        Describe(run->op), ": still running after ", spec_.timeout_ns / 1000000,
        " ms (timeouts.collective_ms); aborted, and the group's epoch ended"));
    uint64_t ticket;
    bool forwarded;
    {
      absl::MutexLock l(&mu_);
      if (run->finished.exchange(true)) continue;  // completed meanwhile
      running_.erase(std::remove(running_.begin(), running_.end(), run), running_.end());
      ++ops_failed_;
      ticket = run->ticket;
      forwarded = run->forwarded;
      awaiting_launch_ = false;  // it will never be launched now
    }
    if (ticket != 0) engine_->Abort(ticket, s);
    std::vector<Arrival> arrivals;
    for (auto& [li, a] : run->op.arrivals) arrivals.push_back(std::move(a));
    // A forwarded composite phase reports through its replicate group.
    if (!forwarded) Notify(std::move(arrivals), s, 0, 0);
    FailEpoch(s, run->op.epoch, /*report=*/true);
  }
  if (!fails.empty() || skipped) Pump();
}

GroupStats Group::stats() const {
  absl::MutexLock l(&mu_);
  GroupStats st;
  st.ops_started = ops_started_;
  st.ops_failed = ops_failed_;
  st.pending = pending_.size();
  st.running = running_.size();
  st.epoch = epoch_;
  st.broken = !epoch_failure_.ok();
  st.waits = waits_;
  return st;
}

}  // namespace hsdp
